// The suffix drafter's state: global trees over cached requests, one per scope
// (a tenant: the caller's key, "" the shared default), bounded per scope and in
// total, oldest evicted first; one tree per in-flight request; read-only corpus
// trees added by the operator. Requests are named by integer handles chosen by
// the caller (the Python front end).
//
// Bounded work per step: a prompt is not inserted at once. start() queues the
// last max_request_tokens prompt tokens for the request's tree and the last
// min(global_prompt_cap, max_cached_tokens / 2) for the global tree; queued
// tokens are inserted oldest request first, at most step_insert_tokens per step
// (a step ends with each speculate call; start() may use what the step has
// left). While a tree still has queued tokens of a request, that request
// drafts from what the tree holds so far (matched by walking, not tracking).
// Output tokens that arrive while a queue is not empty join its end.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
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
  bool merge_drafts = true;  // tree drafts: merge local and global by path probability
  int64_t max_request_tokens = 65536;  // per-request tree: the most recent tokens (>= max_depth)
  int64_t global_prompt_cap = 65536;   // prompt tokens (the last ones) entering the global tree
  int64_t step_insert_tokens = 4096;   // queued tokens inserted per step, both trees together
  int64_t max_scope_tokens = 4000000;  // bound of one scope's global tree (<= max_cached_tokens)
};

// A read-only tree over an operator's documents (one sequence each), built
// outside the engine (no engine state touched: any thread) and attached to it.
struct CorpusTree {
  std::unique_ptr<SuffixTree> tree;
  int64_t tokens = 0;
};
std::shared_ptr<const CorpusTree> build_corpus(const std::vector<std::vector<int32_t>>& docs,
                                               int max_depth);

struct EngineStats {
  int64_t active_requests;
  int64_t cached_requests;
  int64_t cached_tokens;
  int64_t pinned_tokens;
  int64_t global_nodes;
  int64_t local_nodes;
  int64_t local_tokens;
  int64_t pending_tokens;
  int64_t memory_bytes;
  int64_t scopes;
  int64_t corpora;
  int64_t corpus_tokens;
};

class Engine {
 public:
  explicit Engine(const EngineConfig& cfg);

  bool has(int64_t h) const { return reqs_.count(h) != 0; }
  // `scope`: the global tree the request reads and feeds; with use_global
  // false it has none (its own tree and the corpora only).
  void start(int64_t h, const std::vector<int32_t>& prompt, const std::string& scope = "",
             bool use_global = true);
  void extend(int64_t h, const std::vector<int32_t>& tokens);
  // One step: begin_step() inserts queued tokens (up to what the step has
  // left), draft() per request, end_step() grants the next step its budget.
  void begin_step() { advance(); }
  // The returned draft stays valid until the next call.
  const Draft& draft(int64_t h, int max_nodes);
  void end_step() { credit_ = cfg_.step_insert_tokens; }
  const Draft& speculate(int64_t h, int max_nodes) {
    begin_step();
    const Draft& d = draft(h, max_nodes);
    end_step();
    return d;
  }
  void flush();  // inserts every queued token now (tests, tools)
  void finish(int64_t h);
  void abort(int64_t h);
  void reset();
  EngineStats stats() const;
  std::string check() const;  // invariants of every tree, "" when they hold
  void compact();
  // Operator corpora: drafts for requests of the listed scopes (all when empty).
  void add_corpus(const std::string& name, std::shared_ptr<const CorpusTree> corpus,
                  const std::vector<std::string>& scopes);
  bool remove_corpus(const std::string& name);
  std::vector<std::pair<std::string, int64_t>> corpora() const;
  // Warm restarts: every cached sequence (scope, tokens) oldest first, and
  // re-adding one as a finished sequence of its scope (bounds enforced).
  std::vector<std::pair<std::string, std::vector<int32_t>>> export_cached() const;
  void import_cached(const std::string& scope, const std::vector<int32_t>& tokens);

 private:
  // Tokens waiting to enter a tree, in order.
  struct Queue {
    std::vector<int32_t> tokens;
    size_t pos = 0;
    bool empty() const { return pos >= tokens.size(); }
    size_t left() const { return tokens.size() - pos; }
  };
  struct Request {
    std::unique_ptr<SuffixTree> local;  // sequence 0: prompt tail + output (a window)
    int64_t guid = -1;                  // its sequence in the global tree, -1 if none
    std::string scope;                  // its global tree's key
    bool use_global = true;
    Queue queue;                        // not yet in `local`
    std::vector<int32_t> tail;          // the last max_depth..2*max_depth tokens seen
  };
  // One scope's global tree and its cached sequences, oldest first (stale
  // uids skipped). A scope other than "" goes when its last sequence goes.
  struct Scope {
    explicit Scope(int max_depth) : tree(max_depth) {}
    SuffixTree tree;
    std::deque<int64_t> fifo;
    int64_t cached = 0;
  };
  struct Cached {
    int sid;
    Scope* scope;
    std::string key;
    int64_t owner;  // handle of the in-flight request, -1 once finished
    Queue queue;    // not yet in the global tree
    bool finished = false;  // finish the sequence once the queue drains
  };

  Request& get(int64_t h);
  bool global_enabled() const;
  int64_t global_prompt_tokens() const;
  void insert_local(Request& r, const int32_t* t, size_t n);
  int64_t new_cached(const std::string& key, int64_t owner);
  void global_extend(Cached& c, const int32_t* t, size_t n);  // may evict `c`
  void drop_cached(int64_t uid);
  void advance();
  bool evict_oldest();
  bool evict_oldest_in(Scope& s);
  void enforce_bounds(const std::string& key);
  const Scope* scope_of(const Request& r) const;
  int budget(int match_len, int max_nodes) const;
  void best_in_tree(const SuffixTree& tree, int sid, const std::vector<int32_t>& hist,
                    int max_nodes, double floor, Draft& best);

  EngineConfig cfg_;
  std::unordered_map<std::string, std::unique_ptr<Scope>> scopes_;
  int64_t total_live_ = 0;  // live tokens of every scope's tree
  std::map<std::string, std::pair<std::shared_ptr<const CorpusTree>, std::vector<std::string>>>
      corpora_;  // by name (ordered: ties go to the first name)
  std::unordered_map<int64_t, Request> reqs_;
  std::unordered_map<int64_t, Cached> cached_;  // by global uid
  std::deque<int64_t> fifo_;                    // uids of every scope, oldest first (stale skipped)
  std::deque<std::pair<int64_t, int64_t>> work_;  // (handle, uid) with queued tokens, by start
  int64_t credit_ = 0;                          // tokens the current step may still insert
  int64_t next_uid_ = 0;
  Grower grower_;
  DraftMerger merger_;
  Draft local_best_, global_best_, corpus_best_, scratch_, merged_;
  std::vector<Pos> pos_;
};

}  // namespace sse
