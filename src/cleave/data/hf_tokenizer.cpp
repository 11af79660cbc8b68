#include "cleave/data/hf_tokenizer.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "cleave/base/check.h"
#include "cleave/base/file.h"
#include "cleave/data/tokenizer_config.h"
#include "cleave/data/utf8.h"

namespace cleave {

namespace {

using json = nlohmann::json;

// Llama 3's tokenizer.json is 9 MB, Qwen 2's 7 MB, the largest vocabularies' some tens of MB; the
// parsed document takes several times the file's size in memory.
constexpr int64_t kMaxTokenizerJsonBytes = 128 * kMiB;

// GPT-2's pattern, which ByteLevel runs when use_regex is true (Hugging Face's ByteLevel holds
// the same one).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Reads keys of the tokenizer.json; every error names the file and the key's path in it.
struct Keys {
  const std::string& file;

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    CLEAVE_FAIL("tokenizer.json " << file << ": " << key << ": " << what);
  }
  // The member, or nullptr when it is absent or null.
  const json* find(const json& obj, const std::string& at, const char* name) const {
    if (!obj.is_object()) fail(at, "must be an object");
    const auto it = obj.find(name);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }
  const json& need(const json& obj, const std::string& at, const char* name) const {
    const json* v = find(obj, at, name);
    if (!v) fail(join(at, name), "is missing");
    return *v;
  }
  std::string string(const json& obj, const std::string& at, const char* name) const {
    const json& v = need(obj, at, name);
    if (!v.is_string()) fail(join(at, name), "must be a string, not " + brief(v));
    return v.get<std::string>();
  }
  bool flag(const json& obj, const std::string& at, const char* name, bool otherwise) const {
    const json* v = find(obj, at, name);
    if (!v) return otherwise;
    if (!v->is_boolean()) fail(join(at, name), "must be true or false, not " + brief(*v));
    return v->get<bool>();
  }
  // An id: an integer in [0, limit).
  uint32_t id(const json& v, const std::string& at, size_t limit) const {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || uint64_t(v.get<int64_t>()) >= limit)
      fail(at, "must be an integer id from 0 to " + std::to_string(limit - 1) +
                   " (one less than the number of tokens the file lists), not " + brief(v));
    return uint32_t(v.get<int64_t>());
  }
  std::string type(const json& obj, const std::string& at) const {
    return string(obj, at, "type");
  }
  static std::string join(const std::string& at, const char* name) {
    return at.empty() ? std::string(name) : at + "." + name;
  }
  static std::string brief(const json& v) {
    const std::string s = v.dump();
    return s.size() > 60 ? s.substr(0, 60) + "..." : s;
  }
};

std::string in_quotes(const std::string& s) { return "\"" + s + "\""; }

HfTokenizer::AddedTokens sorted_added(std::vector<std::pair<std::string, uint32_t>> tokens) {
  HfTokenizer::AddedTokens out;
  std::stable_sort(tokens.begin(), tokens.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  for (auto& t : tokens) {
    out.by_first_byte[uint8_t(t.first[0])].push_back(std::move(t));
    out.empty = false;
  }
  return out;
}

// A stretch of the text, or an added token found in it (id >= 0).
struct Segment {
  std::string_view text;
  int64_t id;
};

// Cuts each text segment of `in` at the added tokens of `added`: at each position from the left,
// the longest token starting there, if any.
std::vector<Segment> split_added(const std::vector<Segment>& in,
                                 const HfTokenizer::AddedTokens& added) {
  if (added.empty) return in;
  std::vector<Segment> out;
  for (const Segment& seg : in) {
    if (seg.id >= 0) {
      out.push_back(seg);
      continue;
    }
    const std::string_view t = seg.text;
    size_t cut = 0;
    for (size_t i = 0; i < t.size(); ++i) {
      for (const auto& [content, id] : added.by_first_byte[uint8_t(t[i])]) {
        if (t.compare(i, content.size(), content) != 0) continue;
        if (i > cut) out.push_back({t.substr(cut, i - cut), -1});
        out.push_back({t.substr(i, content.size()), int64_t(id)});
        cut = i + content.size();
        i = cut - 1;
        break;
      }
    }
    if (cut < t.size()) out.push_back({t.substr(cut), -1});
  }
  return out;
}

// The pre-tokenizer: ByteLevel alone, or a Sequence of Split patterns and one ByteLevel.
std::vector<HfTokenizer::Step> read_pre_tokenizer(const Keys& k, const json& root) {
  const json& pre = k.need(root, "", "pre_tokenizer");
  std::vector<std::pair<const json*, std::string>> listed;  // each step and its key path
  if (k.type(pre, "pre_tokenizer") == "Sequence") {
    const json& list = k.need(pre, "pre_tokenizer", "pretokenizers");
    if (!list.is_array()) k.fail("pre_tokenizer.pretokenizers", "must be a list");
    for (size_t i = 0; i < list.size(); ++i)
      listed.emplace_back(&list[i], "pre_tokenizer.pretokenizers[" + std::to_string(i) + "]");
  } else {
    listed.emplace_back(&pre, "pre_tokenizer");
  }
  std::vector<HfTokenizer::Step> steps;
  int byte_levels = 0;
  for (const auto& [step, at] : listed) {
    const std::string type = k.type(*step, at);
    HfTokenizer::Step s;
    if (type == "ByteLevel") {
      ++byte_levels;
      s.byte_level = true;
      const json* prefix = k.find(*step, at, "add_prefix_space");
      if (!prefix || !prefix->is_boolean())
        k.fail(at + ".add_prefix_space", "must be true or false");
      s.add_prefix_space = prefix->get<bool>();
      if (k.flag(*step, at, "use_regex", true))
        s.regex = std::make_unique<TokenizerRegex>(kGpt2Pattern, "ByteLevel's GPT-2 pattern");
    } else if (type == "Split") {
      const json& pattern = k.need(*step, at, "pattern");
      const json* regex = k.find(pattern, at + ".pattern", "Regex");
      if (!regex || !regex->is_string())
        k.fail(at + ".pattern", "is " + Keys::brief(pattern) +
                                    ": unsupported (this reader handles {\"Regex\": pattern})");
      const std::string behavior = k.string(*step, at, "behavior");
      if (behavior != "Isolated")
        k.fail(at + ".behavior", in_quotes(behavior) + " is unsupported (this reader handles "
                                                    "\"Isolated\")");
      // With Isolated, matches and the text between them are all pieces: invert changes nothing.
      k.flag(*step, at, "invert", false);
      s.pattern = regex->get<std::string>();
      s.regex = std::make_unique<TokenizerRegex>(s.pattern,
                                                 "tokenizer.json " + k.file + ": " + at + ".pattern");
    } else {
      k.fail(at + ".type", in_quotes(type) + " is unsupported (this reader handles ByteLevel, and "
                                          "Split with a Regex, alone or in a Sequence)");
    }
    steps.push_back(std::move(s));
  }
  if (byte_levels != 1)
    k.fail("pre_tokenizer", "has " + std::to_string(byte_levels) +
                                " ByteLevel steps: a byte-level BPE tokenizer has exactly one");
  return steps;
}

// The post-processor: the ids TemplateProcessing's "single" template puts before and after a
// sequence.
void read_template(const Keys& k, const json& root, size_t vocab_size,
                   std::vector<uint32_t>& before, std::vector<uint32_t>& after) {
  const json* post = k.find(root, "", "post_processor");
  if (!post) return;
  std::vector<std::pair<const json*, std::string>> procs;
  if (k.type(*post, "post_processor") == "Sequence") {
    const json& list = k.need(*post, "post_processor", "processors");
    if (!list.is_array()) k.fail("post_processor.processors", "must be a list");
    for (size_t i = 0; i < list.size(); ++i)
      procs.emplace_back(&list[i], "post_processor.processors[" + std::to_string(i) + "]");
  } else {
    procs.emplace_back(post, "post_processor");
  }
  bool templated = false;
  for (const auto& [proc, at] : procs) {
    const std::string type = k.type(*proc, at);
    if (type == "ByteLevel") continue;  // it trims offsets, which cleave does not keep
    if (type != "TemplateProcessing")
      k.fail(at + ".type", in_quotes(type) + " is unsupported (this reader handles ByteLevel and "
                                          "TemplateProcessing, alone or in a Sequence)");
    if (templated) k.fail(at, "is a second TemplateProcessing");
    templated = true;
    const json& single = k.need(*proc, at, "single");
    const json& specials = k.need(*proc, at, "special_tokens");
    if (!single.is_array()) k.fail(at + ".single", "must be a list");
    int sequences = 0;
    for (size_t i = 0; i < single.size(); ++i) {
      const std::string item = at + ".single[" + std::to_string(i) + "]";
      if (const json* seq = k.find(single[i], item, "Sequence")) {
        if (k.string(*seq, item + ".Sequence", "id") != "A")
          k.fail(item + ".Sequence.id", "must be \"A\" in the template of one sequence");
        ++sequences;
        continue;
      }
      const json* sp = k.find(single[i], item, "SpecialToken");
      if (!sp) k.fail(item, "must be {\"Sequence\": ...} or {\"SpecialToken\": ...}");
      const std::string name = k.string(*sp, item + ".SpecialToken", "id");
      const std::string entry = at + ".special_tokens[" + in_quotes(name) + "]";
      const json* st = k.find(specials, at + ".special_tokens", name.c_str());
      if (!st) k.fail(entry, "is missing (the template names it)");
      const json& ids = k.need(*st, entry, "ids");
      if (!ids.is_array()) k.fail(entry + ".ids", "must be a list");
      for (size_t j = 0; j < ids.size(); ++j)
        (sequences ? after : before)
            .push_back(k.id(ids[j], entry + ".ids[" + std::to_string(j) + "]", vocab_size));
    }
    if (sequences != 1) k.fail(at + ".single", "must hold the sequence ($A) exactly once");
  }
}

}  // namespace

HfTokenizer::HfTokenizer(const std::string& path) {
  path_ = path;
  const Keys k{path};
  json root;
  try {
    root = json::parse(read_bounded_file(path, "tokenizer.json", kMaxTokenizerJsonBytes));
  } catch (const json::exception& e) {
    CLEAVE_FAIL("tokenizer.json " << path << ": not JSON: " << e.what());
  }
  if (!root.is_object()) k.fail("(the document)", "must be a JSON object");
  for (const char* key : {"truncation", "padding"})
    if (k.find(root, "", key)) k.fail(key, "must be null: cleave encodes whole texts, unpadded");
  if (const json* n = k.find(root, "", "normalizer")) {
    // An empty Sequence normalizes nothing either.
    const std::string t = k.type(*n, "normalizer");
    const json* list = t == "Sequence" ? k.find(*n, "normalizer", "normalizers") : nullptr;
    if (t != "Sequence" || (list && !list->empty()))
      k.fail("normalizer", "is " + n->dump().substr(0, 80) +
                               ": unsupported (this reader handles tokenizers without one)");
  }

  // The model: vocabulary and merges.
  const json& model = k.need(root, "", "model");
  const std::string model_type = k.type(model, "model");
  if (model_type != "BPE")
    k.fail("model.type", in_quotes(model_type) + " is unsupported (this reader handles BPE)");
  if (const json* d = k.find(model, "model", "dropout"))
    if (!d->is_number() || d->get<double>() != 0.0)
      k.fail("model.dropout", "is " + Keys::brief(*d) + ": BPE dropout is unsupported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const json* v = k.find(model, "model", key))
      if (!v->is_string() || !v->get<std::string>().empty())
        k.fail(Keys::join("model", key), "is " + Keys::brief(*v) +
                                             ": unsupported in a byte-level vocabulary");
  if (k.flag(model, "model", "byte_fallback", false))
    k.fail("model.byte_fallback", "is true: byte fallback (SentencePiece-style <0x..> tokens) is "
                                  "unsupported; a folder with a tokenizer.model is read from it");
  ignore_merges_ = k.flag(model, "model", "ignore_merges", false);
  const json& vocab_json = k.need(model, "model", "vocab");
  if (!vocab_json.is_object()) k.fail("model.vocab", "must be an object {token: id}");
  const json* added_json = k.find(root, "", "added_tokens");
  if (added_json && !added_json->is_array()) k.fail("added_tokens", "must be a list");
  // Ids are dense in every real file: bounding them by the number of entries bounds what is
  // allocated by the file's size.
  const size_t limit = vocab_json.size() + (added_json ? added_json->size() : 0);
  std::unordered_map<std::string, uint32_t> vocab;
  vocab.reserve(vocab_json.size());
  tokens_.assign(limit, std::string());
  known_.assign(limit, false);
  for (auto it = vocab_json.begin(); it != vocab_json.end(); ++it) {
    const uint32_t id = k.id(it.value(), "model.vocab[" + in_quotes(it.key()) + "]", limit);
    if (known_[id])
      k.fail("model.vocab", "id " + std::to_string(id) + " is given to both " +
                                in_quotes(tokens_[id]) + " and " + in_quotes(it.key()));
    known_[id] = true;
    tokens_[id] = it.key();
    vocab.emplace(it.key(), id);
  }
  for (int b = 0; b < 256; ++b) {
    std::string c;
    append_byte_level(std::string(1, char(b)), c);
    if (!vocab.count(c))
      k.fail("model.vocab", "has no token for the byte " + std::to_string(b) + " (" + in_quotes(c) +
                                "): not a byte-level vocabulary");
  }
  const json& merges_json = k.need(model, "model", "merges");
  if (!merges_json.is_array()) k.fail("model.merges", "must be a list");
  std::vector<BpeModel::Merge> merges;
  merges.reserve(merges_json.size());
  for (size_t i = 0; i < merges_json.size(); ++i) {
    const json& m = merges_json[i];
    const std::string at = "model.merges[" + std::to_string(i) + "]";
    if (m.is_string()) {  // "left right", the format before tokenizers 0.20
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == 0 || space == std::string::npos || space + 1 == s.size() ||
          s.find(' ', space + 1) != std::string::npos)
        k.fail(at, "must be two tokens separated by one space, not " + in_quotes(s));
      merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      k.fail(at, "must be \"left right\" or [\"left\", \"right\"], not " + Keys::brief(m));
    }
  }
  bpe_ = std::make_unique<BpeModel>(std::move(vocab), merges, ignore_merges_,
                                    "tokenizer.json " + path + ": model.merges");
  const std::unordered_map<std::string, uint32_t>& tokens = bpe_->vocab();

  // Added tokens: special or not, each is read as itself wherever it appears in the text.
  std::unordered_map<std::string, uint32_t> added_ids;
  std::vector<std::pair<std::string, uint32_t>> raw, normalized;
  for (size_t i = 0; added_json && i < added_json->size(); ++i) {
    const json& a = (*added_json)[i];
    const std::string at = "added_tokens[" + std::to_string(i) + "]";
    const std::string content = k.string(a, at, "content");
    const uint32_t id = k.id(k.need(a, at, "id"), at + ".id", limit);
    if (content.empty()) k.fail(at + ".content", "is empty");
    if (first_invalid_utf8(content) != std::string::npos) k.fail(at + ".content", "is not UTF-8");
    for (const char* key : {"single_word", "lstrip", "rstrip"})
      if (k.flag(a, at, key, false))
        k.fail(Keys::join(at, key), "is true: unsupported (this reader matches added tokens "
                                    "exactly, without absorbing the spaces around them)");
    const auto in_vocab = tokens.find(content);
    if ((in_vocab != tokens.end() && in_vocab->second != id) ||
        (in_vocab == tokens.end() && known_[id] && tokens_[id] != content))
      k.fail(at + ".id", std::to_string(id) + " (" + in_quotes(content) +
                             ") is already the id of " + in_quotes(tokens_[id]));
    if (added_ids.count(content)) k.fail(at + ".content", in_quotes(content) + " is listed twice");
    added_ids.emplace(content, id);
    known_[id] = true;
    tokens_[id] = content;
    const bool special = k.flag(a, at, "special", false);
    added_.emplace_back(id, special);
    (k.flag(a, at, "normalized", !special) ? normalized : raw).emplace_back(content, id);
  }
  raw_added_ = sorted_added(std::move(raw));
  normalized_added_ = sorted_added(std::move(normalized));
  // Trailing ids the file never uses (it listed a token twice, in vocab and added_tokens).
  while (!known_.empty() && !known_.back()) {
    known_.pop_back();
    tokens_.pop_back();
  }

  steps_ = read_pre_tokenizer(k, root);
  read_template(k, root, tokens_.size(), before_, after_);

  const json& decoder = k.need(root, "", "decoder");
  const std::string decoder_type = k.type(decoder, "decoder");
  if (decoder_type != "ByteLevel")
    k.fail("decoder.type", in_quotes(decoder_type) + " is unsupported (a byte-level BPE tokenizer "
                                                  "decodes with ByteLevel)");

  const TokenizerConfig config = read_tokenizer_config(path);
  chat_template_ = config.chat_template;
  auto id_of = [&](const std::optional<std::string>& token, const char* key) {
    if (!token) return -1;
    const auto a = added_ids.find(*token);
    if (a != added_ids.end()) return int(a->second);
    const auto v = tokens.find(*token);
    if (v != tokens.end()) return int(v->second);
    CLEAVE_FAIL(config.path << ": " << key << " " << in_quotes(*token) << " is not a token of "
                            << path);
  };
  bos_ = id_of(config.bos_token, "bos_token");
  eos_ = id_of(config.eos_token, "eos_token");
}

HfTokenizer::~HfTokenizer() = default;

TokenizerVocabulary HfTokenizer::vocabulary() const {
  TokenizerVocabulary v;
  v.pieces = tokens_;
  v.types.assign(tokens_.size(), TokenizerVocabulary::normal);
  for (size_t id = 0; id < known_.size(); ++id)
    if (!known_[id]) v.types[id] = TokenizerVocabulary::unused;
  for (const auto& [id, special] : added_)
    v.types[id] = special ? TokenizerVocabulary::control : TokenizerVocabulary::user_defined;
  for (const auto& [left, right] : bpe_->merges()) v.merges.push_back(left + " " + right);
  for (const Step& s : steps_) {
    if (!s.byte_level) v.split_patterns.push_back(s.pattern);
    else {
      v.byte_level_regex = s.regex != nullptr;
      v.prefix_space = s.add_prefix_space;
    }
  }
  v.ignore_merges = ignore_merges_;
  return v;
}

void HfTokenizer::pre_tokenize(std::string_view stretch, std::vector<uint32_t>& out) const {
  std::vector<std::string> pieces{std::string(stretch)}, next;
  std::vector<std::string_view> cut;
  for (const Step& step : steps_) {
    next.clear();
    for (std::string& piece : pieces) {
      if (step.byte_level && step.add_prefix_space && piece[0] != ' ') piece.insert(0, 1, ' ');
      cut.clear();
      if (step.regex) step.regex->split_isolated(piece, cut);
      else cut.push_back(piece);
      for (std::string_view c : cut) {
        if (!step.byte_level) {
          next.emplace_back(c);
          continue;
        }
        next.emplace_back();
        append_byte_level(c, next.back());
      }
    }
    pieces.swap(next);
  }
  for (const std::string& piece : pieces) bpe_->encode(piece, out);
}

std::vector<uint32_t> HfTokenizer::encode_text(std::string_view text) const {
  const size_t bad = first_invalid_utf8(text);
  CLEAVE_CHECK(bad == std::string_view::npos,
               "tokenizer " << path_ << ": the text is not valid UTF-8 (at byte " << bad << ")");
  std::vector<uint32_t> ids;
  const std::vector<Segment> segments =
      split_added(split_added({{text, -1}}, raw_added_), normalized_added_);
  for (const Segment& seg : segments) {
    if (seg.id >= 0) ids.push_back(uint32_t(seg.id));
    else if (!seg.text.empty()) pre_tokenize(seg.text, ids);
  }
  return ids;
}

std::string HfTokenizer::decode(const std::vector<uint32_t>& ids) const {
  // ByteLevel's decoder: a token made of byte characters gives their bytes, any other (an added
  // token such as "<|endoftext|>" is mostly both) its own text; the bytes of all of them are then
  // read as UTF-8.
  std::string bytes, own;
  for (size_t i = 0; i < ids.size(); ++i) {
    CLEAVE_CHECK(ids[i] < known_.size() && known_[ids[i]],
                 "tokenizer " << path_ << ": id " << ids[i] << " at index " << i
                              << " is no token (vocab size " << known_.size() << ")");
    const std::string& token = tokens_[ids[i]];
    own.clear();
    bool all_bytes = true;
    for (size_t p = 0; p < token.size() && all_bytes;) {
      const size_t n = utf8_char_length(token, p);
      const int b = n ? byte_level_byte(utf8_decode(token, p, n)) : -1;
      if (b < 0) all_bytes = false;
      else own += char(b);
      p += n;
    }
    bytes += all_bytes ? own : token;
  }
  return utf8_lossy(bytes);
}

}  // namespace cleave
