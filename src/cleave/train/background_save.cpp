#include "cleave/train/background_save.h"

#include <chrono>

namespace cleave {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

BackgroundSave::BackgroundSave(int64_t step, double stall_seconds,
                               std::function<Checksums()> write,
                               std::function<void(const Checksums&)> finish)
    : step_(step), stall_seconds_(stall_seconds), finish_(std::move(finish)) {
  writer_ = std::thread([this, write = std::move(write)] {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      checksums_ = write();
    } catch (...) {
      write_error_ = std::current_exception();
    }
    write_seconds_ = seconds_since(t0);
    written_.store(true, std::memory_order_release);
  });
}

BackgroundSave::~BackgroundSave() {
  if (writer_.joinable()) writer_.join();
  if (finisher_.joinable()) finisher_.join();
}

void BackgroundSave::wait_written() {
  if (writer_.joinable()) writer_.join();
}

void BackgroundSave::all_written() {
  wait_written();
  agreed_ = true;
  if (write_error_) {
    finished_.store(true, std::memory_order_release);
    std::rethrow_exception(write_error_);
  }
  if (!finish_) {
    finished_.store(true, std::memory_order_release);
    return;
  }
  finisher_ = std::thread([this] {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      finish_(checksums_);
    } catch (...) {
      finish_error_ = std::current_exception();
    }
    finish_seconds_ = seconds_since(t0);
    finished_.store(true, std::memory_order_release);
  });
}

void BackgroundSave::wait() {
  if (finisher_.joinable()) finisher_.join();
  if (finish_error_) std::rethrow_exception(finish_error_);
}

}  // namespace cleave
