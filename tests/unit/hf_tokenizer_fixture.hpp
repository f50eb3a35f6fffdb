// Test helper: the Hugging Face tokenizer directories of tests/fixtures/hf_tokenizers
// (gpt2, qwen2, llama3) made whole. The committed tokenizer.skeleton.json files lack
// model.vocab and model.merges (MiBs); they are rebuilt here from ../shared/data
// exactly as tools/tokenizer_dirs.py built them (gpt2: vocab.json + merges.txt;
// qwen.tiktoken: byte-level vocabulary of the ranks, merges derived as transformers'
// TikTokenConverter does), and checked against the SHA-256 of their canonical form
// that the Python tool recorded, so the file loaded is the one the references used.
// Built once per machine into the temp directory (keyed by that SHA-256) and reused.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardlm/core/error.hpp"
#include "shardlm/core/sha256.hpp"
#include "shardlm/data/byte_level_unicode.hpp"
#include "shardlm/data/tiktoken_tokenizer.hpp"
#include "shardlm/data/tokenizer.hpp"

namespace shardlm::testing {

inline std::string read_whole_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  SHARDLM_CHECK(in.good(), "cannot read {}", path.string());
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

// SHA-256 of token ids written as little-endian uint32 (the fixtures' ids_sha256).
inline std::string ids_sha256(const std::vector<int32_t>& ids) {
  std::string bytes;
  bytes.reserve(ids.size() * 4);
  for (int32_t id : ids)
    for (int shift = 0; shift < 32; shift += 8) bytes.push_back(static_cast<char>((static_cast<uint32_t>(id) >> shift) & 0xFF));
  return sha256_hex(bytes.data(), bytes.size());
}

// The first `chars` code points of UTF-8 `text` (Python's text[:chars]).
inline std::string first_code_points(const std::string& text, size_t chars) {
  size_t bytes = 0;
  for (size_t n = 0; n < chars && bytes < text.size(); ++n) {
    ++bytes;
    while (bytes < text.size() && (static_cast<unsigned char>(text[bytes]) & 0xC0) == 0x80) ++bytes;
  }
  return text.substr(0, bytes);
}

struct VocabAndMerges {
  std::vector<std::pair<std::string, int32_t>> vocab;  // token text, id
  std::vector<std::pair<std::string, std::string>> merges;
};

inline VocabAndMerges gpt2_vocab_and_merges(const std::string& data_dir) {
  VocabAndMerges out;
  const auto vocab = nlohmann::json::parse(read_whole_file(data_dir + "/gpt2/vocab.json"));
  for (const auto& [text, id] : vocab.items()) out.vocab.emplace_back(text, id.get<int32_t>());
  std::istringstream merges(read_whole_file(data_dir + "/gpt2/merges.txt"));
  std::string line;
  std::getline(merges, line);  // #version
  while (std::getline(merges, line))
    if (!line.empty()) out.merges.emplace_back(line.substr(0, line.find(' ')), line.substr(line.find(' ') + 1));
  return out;
}

// transformers' TikTokenConverter.extract_vocab_merges_from_model on qwen.tiktoken:
// for every token (rank order), each split into two tokens is a merge; a token's
// merges are ordered by (rank of left, rank of right); all merges by the token's rank.
inline VocabAndMerges tiktoken_vocab_and_merges(const std::string& rank_file) {
  const TiktokenTokenizer ranks(rank_file, tiktoken_preset("qwen"));
  std::vector<std::string> bytes_of_rank;
  std::unordered_map<std::string, int32_t> rank_of;
  for (int32_t rank = 0; rank < 151643; ++rank) {
    const int32_t id[1] = {rank};
    bytes_of_rank.push_back(ranks.decode(id));
    rank_of.emplace(bytes_of_rank.back(), rank);
  }
  VocabAndMerges out;
  for (int32_t rank = 0; rank < static_cast<int32_t>(bytes_of_rank.size()); ++rank) {
    const std::string& token = bytes_of_rank[rank];
    out.vocab.emplace_back(gpt2::bytes_to_token_text(token), rank);
    std::vector<std::pair<int32_t, int32_t>> local;
    for (size_t cut = 1; cut < token.size(); ++cut) {
      const auto left = rank_of.find(token.substr(0, cut));
      const auto right = rank_of.find(token.substr(cut));
      if (left != rank_of.end() && right != rank_of.end()) local.emplace_back(left->second, right->second);
    }
    std::sort(local.begin(), local.end());
    for (const auto& [left, right] : local)
      out.merges.emplace_back(gpt2::bytes_to_token_text(bytes_of_rank[left]),
                              gpt2::bytes_to_token_text(bytes_of_rank[right]));
  }
  return out;
}

// tools/tokenizer_dirs.py canonical_sha256: "id\ttoken\n" by id, then "left\tright\n".
inline std::string canonical_sha256(VocabAndMerges& vm) {
  std::sort(vm.vocab.begin(), vm.vocab.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  Sha256 hash;
  for (const auto& [text, id] : vm.vocab) {
    const std::string line = std::to_string(id) + "\t" + text + "\n";
    hash.update(line.data(), line.size());
  }
  for (const auto& [left, right] : vm.merges) {
    const std::string line = left + "\t" + right + "\n";
    hash.update(line.data(), line.size());
  }
  return hash.hex_digest();
}

// The directory of fixture tokenizer `kind` ("gpt2", "qwen2", "llama3"), built if needed.
inline std::string hf_tokenizer_dir(const std::string& kind) {
  namespace fs = std::filesystem;
  const fs::path fixture = fs::path(SHARDLM_FIXTURE_DIR) / "hf_tokenizers" / kind;
  const std::string skeleton = read_whole_file(fixture / "tokenizer.skeleton.json");
  const std::string config = read_whole_file(fixture / "tokenizer_config.json");
  nlohmann::json content = nlohmann::json::parse(skeleton);
  const nlohmann::json note = content["model"]["merges"];
  const std::string expected = note.at("canonical_sha256");
  // Keyed by both committed files: a changed fixture gets a directory of its own.
  const std::string key = sha256_hex((skeleton + config).data(), skeleton.size() + config.size()).substr(0, 16);
  const fs::path dir = fs::temp_directory_path() / "shardlm_hf_tokenizers" / (kind + "-" + key);
  if (fs::exists(dir / "tokenizer.json")) return dir.string();

  const std::string data_dir = SHARDLM_SHARED_DATA_DIR;
  VocabAndMerges vm = note.at("shardlm_fill") == "gpt2" ? gpt2_vocab_and_merges(data_dir)
                                                         : tiktoken_vocab_and_merges(data_dir + "/qwen/qwen.tiktoken");
  const std::string actual = canonical_sha256(vm);
  SHARDLM_CHECK(actual == expected, "rebuilt vocab + merges of fixture tokenizer {} have canonical sha256 {}, the "
                "Python tool recorded {}", kind, actual, expected);
  nlohmann::json vocab = nlohmann::json::object();
  for (const auto& [text, id] : vm.vocab) vocab[text] = id;
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& [left, right] : vm.merges)
    merges.push_back(note.at("format") == "strings" ? nlohmann::json(left + " " + right) : nlohmann::json({left, right}));
  content["model"]["vocab"] = std::move(vocab);
  content["model"]["merges"] = std::move(merges);

  // Build beside the target and rename, so concurrent test processes never see half a directory.
  const fs::path staging = dir.string() + ".tmp." + std::to_string(::getpid());
  fs::remove_all(staging);
  fs::create_directories(staging);
  std::ofstream(staging / "tokenizer.json", std::ios::binary) << content.dump();
  std::ofstream(staging / "tokenizer_config.json", std::ios::binary) << config;
  std::error_code ec;
  fs::rename(staging, dir, ec);
  if (ec) fs::remove_all(staging);  // another process got there first
  return dir.string();
}

// The fixture tokenizer `kind`, loaded once per test process.
inline const Tokenizer& hf_tokenizer(const std::string& kind) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> loaded;
  std::unique_ptr<Tokenizer>& slot = loaded[kind];
  if (!slot) slot = make_tokenizer(hf_tokenizer_dir(kind));
  return *slot;
}

}  // namespace shardlm::testing
