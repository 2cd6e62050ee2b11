#include "engine.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>

namespace sse {

Engine::Engine(const EngineConfig& cfg) : cfg_(cfg), global_(cfg.max_depth) {}

Engine::Request& Engine::get(int64_t h) {
  auto it = reqs_.find(h);
  if (it == reqs_.end()) throw std::out_of_range("unknown request handle");
  return it->second;
}

bool Engine::global_enabled() const {
  return cfg_.max_cached_requests > 0 && cfg_.max_cached_tokens > 0;
}

void Engine::start(int64_t h, const std::vector<int32_t>& prompt) {
  if (reqs_.count(h)) throw std::invalid_argument("request handle already active");
  Request r;
  r.local = std::make_unique<SuffixTree>(cfg_.max_depth);
  const int sid = r.local->add_sequence();
  r.local->extend(sid, prompt.data(), prompt.size());
  if (global_enabled()) {
    while (static_cast<int64_t>(cached_.size()) >= cfg_.max_cached_requests) evict_oldest();
    const int gsid = global_.add_sequence();
    r.guid = next_uid_++;
    fifo_.push_back(r.guid);
    cached_.emplace(r.guid, Cached{gsid, h});
    if (cfg_.cache_prompts) global_.extend(gsid, prompt.data(), prompt.size());
  }
  reqs_.emplace(h, std::move(r));
  enforce_token_bound();
}

void Engine::extend(int64_t h, const std::vector<int32_t>& tokens) {
  Request& r = get(h);
  r.local->extend(0, tokens.data(), tokens.size());
  if (r.guid >= 0) {
    global_.extend(cached_.at(r.guid).sid, tokens.data(), tokens.size());
    enforce_token_bound();
  }
}

void Engine::finish(int64_t h) {
  Request& r = get(h);
  if (r.guid >= 0) {
    Cached& c = cached_.at(r.guid);
    global_.finish_sequence(c.sid);
    c.owner = -1;
  }
  reqs_.erase(h);
}

void Engine::abort(int64_t h) {
  Request& r = get(h);
  if (r.guid >= 0) {
    global_.remove_sequence(cached_.at(r.guid).sid);
    cached_.erase(r.guid);
  }
  reqs_.erase(h);
}

void Engine::reset() {
  reqs_.clear();
  cached_.clear();
  fifo_.clear();
  global_ = SuffixTree(cfg_.max_depth);
}

void Engine::evict_oldest() {
  while (!fifo_.empty()) {
    const int64_t uid = fifo_.front();
    fifo_.pop_front();
    auto it = cached_.find(uid);
    if (it == cached_.end()) continue;  // aborted earlier
    global_.remove_sequence(it->second.sid);
    if (it->second.owner >= 0) reqs_.at(it->second.owner).guid = -1;
    cached_.erase(it);
    return;
  }
}

void Engine::enforce_token_bound() {
  while (global_.live_tokens() > cfg_.max_cached_tokens && !cached_.empty()) evict_oldest();
}

int Engine::budget(int match_len, int max_nodes) const {
  const double b = std::floor(cfg_.max_spec_factor * match_len + cfg_.max_spec_offset + 1e-9);
  if (b <= 0.0) return 0;
  if (b >= static_cast<double>(max_nodes)) return max_nodes;
  return static_cast<int>(b);
}

// Best draft over all match lengths m (longest first; a shorter match wins only
// with a strictly higher score). Two exact shortcuts: the budget bounds the
// score, and a shorter suffix with the same count as the last one drafted has
// the same continuations (every occurrence extends to the longer one), so it
// cannot score higher unless that draft was cut by the tree's depth.
// Drafts scoring <= `floor` are of no use to the caller and not returned.
void Engine::best_in_tree(const SuffixTree& tree, int sid, const std::vector<int32_t>& hist,
                          int max_nodes, double floor, Draft& best) {
  best.clear();
  const int n = static_cast<int>(hist.size());
  const int longest_possible = std::min(cfg_.max_depth, n);
  const int tracked = sid >= 0 ? std::min(tree.tracked(sid), longest_possible) : 0;
  pos_.resize(longest_possible + 1);
  int longest = tracked;
  for (int m = 1; m <= tracked; ++m) pos_[m] = tree.tracked_pos(sid, m);
  for (int m = tracked + 1; m <= longest_possible; ++m) {
    const Pos p = tree.walk(hist.data() + n - m, m);
    if (p.node < 0) break;
    pos_[m] = p;
    longest = m;
  }
  int32_t ref_count = -1;
  bool ref_limited = true;
  for (int m = longest; m >= 1; --m) {
    const int b = budget(m, max_nodes);
    if (b <= std::max(best.score, floor)) break;
    const int32_t cnt = tree.count(pos_[m]);
    if (cnt == ref_count && !ref_limited) continue;
    grower_.grow(tree, pos_[m], m, b, cfg_.min_token_prob, cfg_.use_tree, scratch_);
    ref_count = cnt;
    ref_limited = scratch_.depth_limited;
    if (scratch_.score > std::max(best.score, floor)) {
      std::swap(best, scratch_);
      best.match_len = m;
    }
  }
}

const Draft& Engine::speculate(int64_t h, int max_nodes) {
  Request& r = get(h);
  const std::vector<int32_t>& hist = r.local->tokens(0);
  best_in_tree(*r.local, 0, hist, max_nodes, 0.0, local_best_);
  global_best_.clear();
  if (global_enabled()) {
    // The global draft wins only with a strictly higher score.
    const int sid = r.guid >= 0 ? cached_.at(r.guid).sid : -1;
    best_in_tree(global_, sid, hist, max_nodes, local_best_.score, global_best_);
  }
  return local_best_.score >= global_best_.score ? local_best_ : global_best_;
}

EngineStats Engine::stats() const {
  EngineStats s{};
  s.active_requests = static_cast<int64_t>(reqs_.size());
  s.cached_requests = static_cast<int64_t>(cached_.size());
  s.cached_tokens = global_.live_tokens();
  s.pinned_tokens = global_.pinned_tokens();
  s.global_nodes = global_.num_nodes() - 1;
  s.memory_bytes = global_.memory_bytes();
  for (const auto& kv : reqs_) {
    s.local_nodes += kv.second.local->num_nodes() - 1;
    s.local_tokens += kv.second.local->live_tokens();
    s.memory_bytes += kv.second.local->memory_bytes();
  }
  return s;
}

std::string Engine::check() const {
  std::string err = global_.check();
  if (!err.empty()) return "global tree: " + err;
  for (const auto& kv : reqs_) {
    err = kv.second.local->check();
    if (!err.empty()) return "request tree " + std::to_string(kv.first) + ": " + err;
  }
  return "";
}

}  // namespace sse
