#include "cleave/data/loader.h"

#include <limits>

#include "cleave/base/check.h"
#include "cleave/base/philox.h"

namespace cleave {

namespace {

// Separates the loader's Philox key from other users of the same run seed (parameter init...).
const uint64_t kLoaderKeySalt = hash_name("cleave.data.BatchLoader");

// Offset of sample `sample` of step `step`: uniform in [0, n_offsets) from 64 Philox bits mapped
// by a 64x64->128 multiply (bias at most n_offsets / 2^64). The counter holds (sample, step,
// split); the key is the salted seed.
uint64_t sample_offset(uint64_t seed, uint64_t split_id, uint64_t step, uint64_t sample,
                       uint64_t n_offsets) {
  const uint64_t key = seed ^ kLoaderKeySalt;
  const auto r = philox4x32({uint32_t(sample), uint32_t(step), uint32_t(step >> 32),
                             uint32_t(split_id)},
                            {uint32_t(key), uint32_t(key >> 32)});
  const uint64_t bits = uint64_t(r[0]) | (uint64_t(r[1]) << 32);
  return uint64_t((static_cast<unsigned __int128>(bits) * n_offsets) >> 64);
}

}  // namespace

BatchLoader::BatchLoader(const TokenShard& shard, int64_t seq_len, uint64_t seed,
                         uint64_t split_id, DocumentOptions documents, ContextSplit split)
    : shard_(shard), seq_len_(seq_len), seed_(seed), split_id_(split_id), documents_(documents),
      split_(split) {
  CLEAVE_CHECK(split.cp >= 1 && split.rank >= 0 && split.rank < split.cp,
               "context split: rank " << split.rank << " of cp " << split.cp);
  if (split.cp > 1 && seq_len % (2 * split.cp) != 0)
    CLEAVE_FAIL("train.seq_len = " << seq_len << " cannot be cut into 2 x parallel.cp = "
                                   << 2 * split.cp << " equal chunks");
  CLEAVE_CHECK(seq_len > 0, "seq_len=" << seq_len << " must be positive");
  CLEAVE_CHECK(split_id <= std::numeric_limits<uint32_t>::max(),
               "split_id=" << split_id << " must fit in 32 bits");
  if (shard.size() < uint64_t(seq_len) + 1)
    CLEAVE_FAIL("token file " << shard.path() << " has " << shard.size()
                              << " tokens, too few for seq_len " << seq_len << " (needs at least "
                              << seq_len + 1 << ")");
  CLEAVE_CHECK(shard.vocab_size() <= uint32_t(std::numeric_limits<int32_t>::max()),
               "token file " << shard.path() << ": vocab size " << shard.vocab_size()
                             << " does not fit int32 token ids");
}

void BatchLoader::fill(int32_t* inputs, int32_t* targets, uint64_t step, int64_t first_sample,
                       int64_t count) const {
  CLEAVE_CHECK(first_sample >= 0 && count >= 0,
               "first_sample=" << first_sample << " count=" << count << " must be >= 0");
  CLEAVE_CHECK(uint64_t(first_sample) + uint64_t(count) <= (uint64_t(1) << 32),
               "sample indices [" << first_sample << ", " << first_sample + count
                                  << ") must stay below 2^32");
  const uint32_t* tokens = shard_.tokens().data();
  const uint64_t n_offsets = shard_.size() - uint64_t(seq_len_);  // offsets 0 .. size-seq_len-1
  const int64_t T = seq_len_;
  for (int64_t r = 0; r < count; ++r) {
    const uint64_t off =
        sample_offset(seed_, split_id_, step, uint64_t(first_sample + r), n_offsets);
    const uint32_t* src = tokens + off;
    int32_t* in_row = inputs + r * T;
    int32_t* tg_row = targets + r * T;
    for (int64_t t = 0; t < T; ++t) {
      in_row[t] = int32_t(src[t]);
      tg_row[t] = int32_t(src[t + 1]);
    }
  }
}

void BatchLoader::fill(Batch& batch, uint64_t step, int64_t first_sample, int64_t count) const {
  if (split_.cp == 1) return fill_whole(batch, step, first_sample, count);
  fill_whole(whole_, step, first_sample, count);
  const int cp = split_.cp;
  const int64_t c = seq_len_ / (2 * cp), T = 2 * c;
  batch.resize(count, T);
  batch.documents.clear();
  batch.sequence_documents = whole_.documents;
  if (!whole_.documents.empty()) batch.documents.resize(size_t(count * T));
  batch.valid_tokens = 0;
  for (int64_t r = 0; r < count; ++r)
    for (int h = 0; h < 2; ++h) {
      const int64_t from = r * seq_len_ + (h == 0 ? split_.rank : 2 * cp - 1 - split_.rank) * c;
      const int64_t to = r * T + h * c;
      for (int64_t t = 0; t < c; ++t) {
        const size_t i = size_t(to + t), j = size_t(from + t);
        batch.tokens[i] = whole_.tokens[j];
        batch.targets[i] = whole_.targets[j];
        batch.positions[i] = whole_.positions[j];
        batch.loss_mask[i] = whole_.loss_mask[j];
        if (!whole_.documents.empty()) batch.documents[i] = whole_.documents[j];
        batch.valid_tokens += whole_.loss_mask[j];
      }
    }
}

void BatchLoader::fill_whole(Batch& batch, uint64_t step, int64_t first_sample,
                             int64_t count) const {
  batch.whole_sequences(count, seq_len_);
  fill(batch.tokens.data(), batch.targets.data(), step, first_sample, count);
  if (!documents_.mask && !documents_.reset_positions) return;
  const int64_t T = seq_len_;
  if (documents_.mask) batch.documents.resize(size_t(count * T));
  for (int64_t r = 0; r < count; ++r) {
    int32_t document = 0, start = 0;  // of the token at t: its document, where that begins
    for (int64_t t = 0; t < T; ++t) {
      const size_t i = size_t(r * T + t);
      if (documents_.mask) batch.documents[i] = document;
      if (documents_.reset_positions) batch.positions[i] = int32_t(t) - start;
      if (batch.tokens[i] == documents_.separator) ++document, start = int32_t(t) + 1;
    }
  }
}

}  // namespace cleave
