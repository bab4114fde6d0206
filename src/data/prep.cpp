// The prep pipelines. See prep.hpp.
#include "src/data/prep.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>

#include "base/error.hpp"
#include "io/h5.hpp"
#include "src/data/bpe_tokenizer.hpp"
#include "src/data/records.hpp"
#include "src/data/tokenizer.hpp"

namespace sb {

namespace fs = std::filesystem;

// format attribute of a *.h5 file ("" when it has none or does not open as HDF5).
static std::string format_of(const fs::path& p) {
  h5::quiet_errors();
  try {
    h5::check_file(p.string(), "a token shard");  // a FIFO would block the open, a damaged file crash libhdf5
  } catch (const Error&) {
    return "";
  }
  hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) return "";
  h5::Id id(f);
  try {
    return h5::has_attr(id, "format") ? h5::read_attr_string(id, "format", p.string()) : "";
  } catch (const std::exception&) {
    return "";
  }
}

ShardSetWriter::ShardSetWriter(const std::string& dir, const ShardMeta& meta, uint64_t shard_tokens, bool overwrite)
    : dir_(dir), meta_(meta), shard_tokens_(std::max<uint64_t>(shard_tokens, 1)) {
  if (dir.empty()) throw Error("prep: --output DIR is required");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) throw Error(dir + ": cannot create output directory (--output)");
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".h5") old_.push_back(e.path().string());
  if (!old_.empty() && !overwrite)
    throw Error(dir + ": already holds " + std::to_string(old_.size()) +
                " *.h5 files; pass --overwrite (prep.overwrite=true) to replace them, or choose another --output");
  for (const auto& p : old_)
    if (const std::string f = format_of(p); f != kShardFormat)
      throw Error(p + ": not a shard (attribute format is \"" + f + "\", expected \"" + kShardFormat +
                  "\"): --overwrite replaces only shards; move it out of --output " + dir + " first (nothing was changed)");
  staging_ = (fs::path(dir) / (".prep_staging_" + std::to_string(::getpid()))).string();
  fs::remove_all(staging_, ec);
  fs::create_directories(staging_, ec);
  if (ec) throw Error(staging_ + ": cannot create the staging directory of the new shards: " + ec.message());
}

ShardSetWriter::~ShardSetWriter() {
  cur_.reset();  // removes its temporary
  std::error_code ec;
  if (!staging_.empty()) fs::remove_all(staging_, ec);
}

void ShardSetWriter::add(std::span<const uint32_t> tokens, TaskSpan task, std::span<const uint8_t> mask) {
  if (cur_ && cur_->num_docs() > 0 && cur_->num_tokens() + tokens.size() > shard_tokens_) {
    cur_->close();
    stats_.tokens += cur_->num_tokens(), stats_.documents += cur_->num_docs();
    cur_.reset();
  }
  if (!cur_) {
    char name[32];
    std::snprintf(name, sizeof name, "shard_%05llu.h5", (unsigned long long)stats_.shards);
    stats_.files.push_back((fs::path(dir_) / name).string());
    cur_ = std::make_unique<ShardWriter>((fs::path(staging_) / name).string(), meta_);
    ++stats_.shards;
  }
  cur_->add(tokens, task, mask);
}

PrepStats ShardSetWriter::finish() {
  if (cur_) {
    cur_->close();
    stats_.tokens += cur_->num_tokens(), stats_.documents += cur_->num_docs();
    cur_.reset();
  }
  if (stats_.documents == 0) throw Error("prep: the input holds no documents; nothing written to " + dir_ + " (left as it was)");
  // The new set is complete: replace the old shards (a new one of the same name by an atomic rename).
  std::error_code ec;
  for (const auto& f : stats_.files) {
    fs::rename(fs::path(staging_) / fs::path(f).filename(), f, ec);
    if (ec) throw Error(f + ": cannot move the new shard into place: " + ec.message());
  }
  for (const auto& p : old_)
    if (std::find(stats_.files.begin(), stats_.files.end(), p) == stats_.files.end()) fs::remove(p, ec);
  fs::remove_all(staging_, ec);
  return stats_;
}

void check_input_file(const std::string& path) {
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (ec || !fs::exists(st)) throw Error(path + ": no such input file (--input)");
  if (fs::is_directory(st)) throw Error(path + ": is a directory; --input expects files (e.g. " + path + "/*.txt)");
  if (!fs::is_regular_file(st)) throw Error(path + ": not a regular file (a FIFO or a device?); --input expects files");
}

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open input file (--input)");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool is_blank(std::string_view line) {
  for (char c : line)
    if (c != ' ' && c != '\t' && c != '\r') return false;
  return true;
}

}  // namespace

void encode_pieces(const Record& rec, const std::function<void(std::string_view, std::vector<uint32_t>&)>& encode,
                   std::vector<uint32_t>& tokens, std::vector<uint8_t>& mask) {
  tokens.clear(), mask.clear();
  for (const auto& p : rec.pieces) {  // each piece on its own: a boundary is a token boundary
    const size_t before = tokens.size();
    encode(p.text, tokens);
    mask.insert(mask.end(), tokens.size() - before, uint8_t(p.trained));
  }
  if (!rec.whole) return;
  // The ids are the whole text's. Piece boundaries next to special tokens (and after a header's
  // newline before text that does not start with whitespace) leave them unchanged, the usual case.
  std::string text;
  for (const auto& p : rec.pieces) text += p.text;
  std::vector<uint32_t> whole;
  encode(text, whole);
  if (whole == tokens) return;
  // A token spans a boundary (e.g. "\n" + "\nanswer" pre-tokenizes as "\n\n"): piece k starts at
  // the first token where whole and the ids of the text before it part; a spanning token goes
  // with the later piece.
  std::vector<uint8_t> m(whole.size(), 0);
  size_t at = 0, start = 0;
  std::vector<uint32_t> prefix;
  for (size_t k = 0; k < rec.pieces.size(); ++k) {
    size_t end = whole.size();
    at += rec.pieces[k].text.size();
    if (k + 1 < rec.pieces.size()) {
      prefix.clear();
      encode(std::string_view(text).substr(0, at), prefix);
      end = 0;
      while (end < prefix.size() && end < whole.size() && prefix[end] == whole[end]) ++end;
      end = std::max(end, start);
    }
    std::fill(m.begin() + long(start), m.begin() + long(end), uint8_t(rec.pieces[k].trained));
    start = end;
  }
  tokens = std::move(whole), mask = std::move(m);
}

std::vector<std::string> split_blank_lines(const std::string& text) {
  std::vector<std::string> docs;
  std::string cur;
  bool in_doc = false;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    size_t end = nl == std::string::npos ? text.size() : nl;
    std::string_view line(text.data() + pos, end - pos);
    if (is_blank(line)) {
      if (in_doc) docs.push_back(std::move(cur)), cur.clear(), in_doc = false;
    } else {
      if (in_doc) cur += '\n';
      cur.append(line), in_doc = true;
    }
    pos = nl == std::string::npos ? text.size() : nl + 1;
  }
  if (in_doc) docs.push_back(std::move(cur));
  return docs;
}

PrepStats prep_text(const std::vector<std::string>& inputs, const std::string& format, const std::string& split,
                    const PrepOptions& opt) {
  if (inputs.empty()) throw Error("prep text: --input FILE... is required");
  if (format != "text" && format != "jsonl")
    throw Error("prep text: --format " + format + ": expected text or jsonl");
  if (format == "text" && split != "blank-lines" && split != "file")
    throw Error("prep text: --split " + split + ": expected blank-lines or file");
  double t0 = now_s();
  std::optional<BpeTokenizer> bpe;
  ShardMeta meta{ByteTokenizer::kVocabSize, ByteTokenizer::kName, ByteTokenizer::kEos};
  if (!opt.tokenizer.empty()) {
    bpe.emplace(BpeTokenizer::load(opt.tokenizer));
    meta = {bpe->vocab_size(), bpe->shard_name(), int64_t(bpe->eos_id(opt.eos))};
  }
  const ChatTemplate chat = choose_chat_template(opt.chat_template, opt.tokenizer, opt.chat_date);
  if (bpe && chat.family != ChatFamily::Plain)  // its markers must be single tokens, as in the model
    for (const char* t : chat.family == ChatFamily::ChatML
                             ? std::vector<const char*>{"<|im_start|>", "<|im_end|>"}
                             : std::vector<const char*>{"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"})
      if (!bpe->token_id(t))
        throw Error(opt.tokenizer + ": has no token " + t + ", which the " + chat_family_name(chat.family) +
                    " chat template writes (" + chat.source + "); choose another --chat-template");
  ShardSetWriter out(opt.output, meta, opt.shard_tokens, opt.overwrite);
  uint64_t chats = 0;  // "messages" records rendered
  std::vector<uint32_t> ids;
  std::string where;  // the document being added, for a tokenizer error (text that is not UTF-8)
  // Appends the ids of `text` with the chosen tokenizer (`where` names the document in an error).
  auto encode = [&](std::string_view text, std::vector<uint32_t>& to) {
    if (!bpe) {
      const auto t = ByteTokenizer::encode(text);
      to.insert(to.end(), t.begin(), t.end());
      return;
    }
    try {
      bpe->encode(text, to);
    } catch (const Error& e) {
      throw Error(where + ": " + e.what());
    }
  };
  auto add = [&](std::string_view doc) {
    if (doc.empty()) return;  // empty documents carry nothing to learn
    ids.clear();
    encode(doc, ids);
    out.add(ids);
  };
  for (const auto& path : inputs) {
    check_input_file(path);
    if (format == "jsonl") {
      std::ifstream in(path, std::ios::binary);
      if (!in) throw Error(path + ": cannot open input file (--input)");
      size_t lineno = 0;
      for (std::string line; std::getline(in, line);) {
        ++lineno;
        if (is_blank(line)) continue;
        where = path + ":" + std::to_string(lineno);
        auto rec = parse_record(line, where, chat);
        chats += rec.chat;
        if (rec.pieces.size() == 1 && !rec.whole) {  // "text": all trained, no mask
          add(rec.pieces[0].text);
          continue;
        }
        std::vector<uint32_t> tokens;
        std::vector<uint8_t> mask;
        encode_pieces(rec, encode, tokens, mask);
        out.add(tokens, {}, mask);
      }
    } else if (split == "file") {
      where = path;
      add(read_file(path));
    } else {
      size_t k = 0;
      for (const auto& doc : split_blank_lines(read_file(path))) {
        where = path + " (document " + std::to_string(k++) + " of the file)";
        add(doc);
      }
    }
  }
  auto stats = out.finish();
  stats.seconds = now_s() - t0;
  if (chats)
    stats.chat_template = std::string(chat_family_name(chat.family)) + (chat.think ? " with <think>" : "") +
                          (chat.default_system.empty() ? "" : " with its default system prompt") +
                          (chat.dated_header.empty() ? "" : " with its dated system block, Today Date: " + chat.date + " (" + chat.date_from + ")") +
                          " (" + chat.source + ")";
  return stats;
}

PrepStats prep_bin(const std::vector<std::string>& inputs, int64_t eot, int64_t vocab_size, const PrepOptions& opt) {
  if (inputs.empty()) throw Error("prep bin: --input FILE... is required");
  if (vocab_size <= 0 || vocab_size > 65536)
    throw Error("prep bin: --vocab " + std::to_string(vocab_size) + ": expected 1..65536 (uint16 tokens)");
  if (eot < 0 || eot >= vocab_size)
    throw Error("prep bin: --eot " + std::to_string(eot) + ": expected 0 <= eot < vocab " + std::to_string(vocab_size));
  double t0 = now_s();
  ShardSetWriter out(opt.output, {vocab_size, "gpt2", eot}, opt.shard_tokens, opt.overwrite);
  constexpr int32_t kMagic = 20240520, kVersion = 1;
  for (const auto& path : inputs) {
    check_input_file(path);
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(path + ": cannot open input file (--input)");
    std::error_code ec;
    uint64_t size = fs::file_size(path, ec);
    int32_t header[256] = {};
    if (ec || size < sizeof header || !in.read(reinterpret_cast<char*>(header), sizeof header))
      throw Error(path + ": too short for the llm.c header (1024 bytes)");
    if (header[0] != kMagic)
      throw Error(path + ": header magic is " + std::to_string(header[0]) + ", expected " + std::to_string(kMagic) +
                  " (not an llm.c token file?)");
    if (header[1] != kVersion)
      throw Error(path + ": header version is " + std::to_string(header[1]) + ", expected " + std::to_string(kVersion));
    uint64_t count = uint64_t(uint32_t(header[2]));
    if (size != sizeof header + 2 * count)
      throw Error(path + ": header says " + std::to_string(count) + " tokens (" + std::to_string(2 * count) +
                  " bytes) but the file has " + std::to_string(size - sizeof header) + " bytes after the header");
    // Stream: a document may span read blocks, so it accumulates in `doc`.
    std::vector<uint16_t> block(1 << 20);
    std::vector<uint32_t> doc;
    uint64_t done = 0;
    while (done < count) {
      size_t n = size_t(std::min<uint64_t>(block.size(), count - done));
      if (!in.read(reinterpret_cast<char*>(block.data()), std::streamsize(2 * n)))
        throw Error(path + ": read failed at token " + std::to_string(done));
      for (size_t i = 0; i < n; ++i) {
        uint32_t t = block[i];
        if (t == uint32_t(eot)) {
          if (!doc.empty()) out.add(doc), doc.clear();
        } else if (int64_t(t) >= vocab_size) {
          throw Error(path + ": token " + std::to_string(done + i) + " = " + std::to_string(t) + " is >= --vocab " +
                      std::to_string(vocab_size));
        } else {
          doc.push_back(t);
        }
      }
      done += n;
    }
    if (!doc.empty()) out.add(doc);  // a last document without a closing EOT
  }
  auto stats = out.finish();
  stats.seconds = now_s() - t0;
  return stats;
}

PrepStats prep_synth(const SynthOptions& synth, const PrepOptions& opt) {
  if (synth.docs == 0) throw Error("prep synth: --docs must be > 0");
  double t0 = now_s();
  if (opt.mask != "none" && opt.mask != "answers")
    throw Error("prep synth: --mask " + opt.mask + ": expected none or answers");
  SynthCorpus corpus(synth);
  ShardSetWriter out(opt.output, {ByteTokenizer::kVocabSize, ByteTokenizer::kName, ByteTokenizer::kEos},
                     opt.shard_tokens, opt.overwrite);
  for (uint64_t i = 0; i < synth.docs; ++i) {
    auto d = corpus.doc(i);
    std::vector<uint8_t> mask;
    if (opt.mask == "answers") {  // train only the answers (every question's, with --ask all); filler nothing
      mask.assign(d.text.size(), 0);
      for (const auto& [b, e] : d.answers) std::fill(mask.begin() + long(b), mask.begin() + long(e), 1);
    }
    out.add(ByteTokenizer::encode(d.text), d.task, mask);
  }
  auto stats = out.finish();
  stats.seconds = now_s() - t0;
  return stats;
}

}  // namespace sb
