// Actions as text, in PyTorch pipelining's notation: <stage><TYPE><micro-batch>.
#include <cctype>
#include <string>

#include "cleave/base/check.h"
#include "cleave/pipeline/schedule.h"

namespace cleave {

namespace {

struct TypeName {
  ActionType type;
  const char* text;
};
constexpr TypeName kTypeNames[] = {
    {ActionType::forward, "F"},          {ActionType::backward, "B"},
    {ActionType::backward_input, "I"},   {ActionType::backward_weight, "W"},
    {ActionType::send_forward, "SEND_F"}, {ActionType::recv_forward, "RECV_F"},
    {ActionType::send_backward, "SEND_B"}, {ActionType::recv_backward, "RECV_B"},
};

// Nine digits at most, so the value fits an int whatever the text.
constexpr size_t kMaxDigits = 9;

[[noreturn]] void not_an_action(const std::string& text) {
  throw Error("not a pipeline action: '" + text +
              "' (expected <stage><F|B|I|W|SEND_F|RECV_F|SEND_B|RECV_B><micro-batch>, e.g. 0F3 "
              "or 1SEND_B2)");
}

}  // namespace

std::string to_string(const Action& a) {
  for (const TypeName& t : kTypeNames)
    if (t.type == a.type) return std::to_string(a.stage) + t.text + std::to_string(a.mb);
  throw Error("action of unknown type " + std::to_string(int(a.type)));
}

Action parse_action(const std::string& text) {
  size_t head = 0;
  while (head < text.size() && std::isdigit(static_cast<unsigned char>(text[head]))) ++head;
  size_t tail = text.size();
  while (tail > head && std::isdigit(static_cast<unsigned char>(text[tail - 1]))) --tail;
  if (head == 0 || tail == text.size() || tail == head || head > kMaxDigits ||
      text.size() - tail > kMaxDigits)
    not_an_action(text);
  const std::string type = text.substr(head, tail - head);
  for (const TypeName& t : kTypeNames) {
    if (type != t.text) continue;
    Action a;
    a.type = t.type;
    a.stage = std::stoi(text.substr(0, head));
    a.mb = std::stoi(text.substr(tail));
    return a;
  }
  not_an_action(text);
}

}  // namespace cleave
