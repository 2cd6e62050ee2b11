// The suffix drafter's state: one global tree over cached requests (bounded,
// oldest evicted first) and one tree per in-flight request. Requests are named
// by integer handles chosen by the caller (the Python front end).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "draft.h"
#include "suffix_tree.h"

namespace sse {

struct EngineConfig {
  int max_depth = 64;
  double max_spec_factor = 1.0;
  double max_spec_offset = 0.0;
  double min_token_prob = 0.1;
  int64_t max_cached_requests = 10000;
  int64_t max_cached_tokens = 4000000;
  bool cache_prompts = true;
  bool use_tree = true;
};

struct EngineStats {
  int64_t active_requests;
  int64_t cached_requests;
  int64_t cached_tokens;
  int64_t pinned_tokens;
  int64_t global_nodes;
  int64_t local_nodes;
  int64_t local_tokens;
  int64_t memory_bytes;
};

class Engine {
 public:
  explicit Engine(const EngineConfig& cfg);

  bool has(int64_t h) const { return reqs_.count(h) != 0; }
  void start(int64_t h, const std::vector<int32_t>& prompt);
  void extend(int64_t h, const std::vector<int32_t>& tokens);
  // The returned draft stays valid until the next call.
  const Draft& speculate(int64_t h, int max_nodes);
  void finish(int64_t h);
  void abort(int64_t h);
  void reset();
  EngineStats stats() const;
  std::string check() const;  // invariants of every tree, "" when they hold
  void compact() { global_.compact(); }

 private:
  struct Request {
    std::unique_ptr<SuffixTree> local;  // sequence 0: prompt + output
    int64_t guid = -1;                  // its sequence in the global tree, -1 if none
  };
  struct Cached {
    int sid;
    int64_t owner;  // handle of the in-flight request, -1 once finished
  };

  Request& get(int64_t h);
  bool global_enabled() const;
  void evict_oldest();
  void enforce_token_bound();
  int budget(int match_len, int max_nodes) const;
  void best_in_tree(const SuffixTree& tree, int sid, const std::vector<int32_t>& hist,
                    int max_nodes, double floor, Draft& best);

  EngineConfig cfg_;
  SuffixTree global_;
  std::unordered_map<int64_t, Request> reqs_;
  std::unordered_map<int64_t, Cached> cached_;  // by global uid
  std::deque<int64_t> fifo_;                    // uids, oldest first (stale ones skipped)
  int64_t next_uid_ = 0;
  Grower grower_;
  Draft local_best_, global_best_, scratch_;
  std::vector<Pos> pos_;
};

}  // namespace sse
