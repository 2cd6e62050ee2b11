#include "engine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <utility>

namespace sse {

namespace {
constexpr size_t kMaxReservedNodes = size_t{1} << 23;

void append_tail(std::vector<int32_t>& out, const int32_t* t, size_t n, size_t keep) {
  if (n >= keep) {
    out.assign(t + n - keep, t + n);
    return;
  }
  out.insert(out.end(), t, t + n);
  if (out.size() > 2 * keep) out.erase(out.begin(), out.end() - keep);
}
}  // namespace

Engine::Engine(const EngineConfig& cfg)
    : cfg_(cfg), global_(cfg.max_depth), credit_(cfg.step_insert_tokens) {
  if (cfg_.max_request_tokens < cfg_.max_depth) {
    throw std::invalid_argument("max_request_tokens must be >= max_depth");
  }
  reset();
}

Engine::Request& Engine::get(int64_t h) {
  auto it = reqs_.find(h);
  if (it == reqs_.end()) throw std::out_of_range("unknown request handle");
  return it->second;
}

bool Engine::global_enabled() const {
  return cfg_.max_cached_requests > 0 && cfg_.max_cached_tokens > 0;
}

int64_t Engine::global_prompt_tokens() const {
  if (!cfg_.cache_prompts) return 0;
  return std::min(cfg_.global_prompt_cap, cfg_.max_cached_tokens / 2);
}

void Engine::start(int64_t h, const std::vector<int32_t>& prompt) {
  if (reqs_.count(h)) throw std::invalid_argument("request handle already active");
  const size_t n = prompt.size();
  Request r;
  r.local = std::make_unique<SuffixTree>(cfg_.max_depth);
  r.local->add_sequence();
  const size_t keep_local = std::min(n, static_cast<size_t>(cfg_.max_request_tokens));
  r.queue.tokens.assign(prompt.end() - keep_local, prompt.end());
  append_tail(r.tail, prompt.data(), n, static_cast<size_t>(cfg_.max_depth));
  if (global_enabled()) {
    while (static_cast<int64_t>(cached_.size()) >= cfg_.max_cached_requests) evict_oldest();
    const int gsid = global_.add_sequence();
    r.guid = next_uid_++;
    fifo_.push_back(r.guid);
    Cached c{gsid, h, Queue{}, false};
    const size_t keep = std::min(n, static_cast<size_t>(global_prompt_tokens()));
    c.queue.tokens.assign(prompt.end() - keep, prompt.end());
    cached_.emplace(r.guid, std::move(c));
  }
  work_.emplace_back(h, r.guid);
  reqs_.emplace(h, std::move(r));
  advance();
}

void Engine::insert_local(Request& r, const int32_t* t, size_t n) {
  SuffixTree& tree = *r.local;
  tree.extend(0, t, n);
  const int64_t size = static_cast<int64_t>(tree.tokens(0).size());
  if (tree.live_size(0) > cfg_.max_request_tokens) tree.trim_front(0, size - cfg_.max_request_tokens);
}

// May evict `c` itself (the caller must not use it afterwards).
void Engine::insert_global(Cached& c, const int32_t* t, size_t n) {
  global_.extend(c.sid, t, n);
  enforce_token_bound();
}

void Engine::extend(int64_t h, const std::vector<int32_t>& tokens) {
  Request& r = get(h);
  const size_t n = tokens.size();
  append_tail(r.tail, tokens.data(), n, static_cast<size_t>(cfg_.max_depth));
  if (!r.queue.empty()) {
    r.queue.tokens.insert(r.queue.tokens.end(), tokens.begin(), tokens.end());
  } else {
    insert_local(r, tokens.data(), n);
  }
  if (r.guid >= 0) {
    Cached& c = cached_.at(r.guid);
    if (!c.queue.empty()) {
      c.queue.tokens.insert(c.queue.tokens.end(), tokens.begin(), tokens.end());
    } else {
      insert_global(c, tokens.data(), n);
    }
  }
}

// Queued tokens, oldest request first: its tree, then the global tree.
void Engine::advance() {
  while (!work_.empty()) {
    const auto [h, uid] = work_.front();
    auto rit = reqs_.find(h);
    if (rit != reqs_.end() && !rit->second.queue.empty()) {
      if (credit_ <= 0) return;
      Queue& q = rit->second.queue;
      const size_t k = std::min(q.left(), static_cast<size_t>(credit_));
      insert_local(rit->second, q.tokens.data() + q.pos, k);
      q.pos += k;
      credit_ -= static_cast<int64_t>(k);
      if (q.empty()) q = Queue{};
      continue;
    }
    auto cit = uid >= 0 ? cached_.find(uid) : cached_.end();
    if (cit != cached_.end() && !cit->second.queue.empty()) {
      if (credit_ <= 0) return;
      Cached& c = cit->second;
      Queue& q = c.queue;
      const size_t k = std::min(q.left(), static_cast<size_t>(credit_));
      global_.extend(c.sid, q.tokens.data() + q.pos, k);
      q.pos += k;
      credit_ -= static_cast<int64_t>(k);
      if (q.empty()) {
        q = Queue{};
        if (c.finished) global_.finish_sequence(c.sid);
      }
      enforce_token_bound();  // may evict uid
      continue;
    }
    work_.pop_front();
  }
}

void Engine::flush() {
  credit_ = std::numeric_limits<int64_t>::max();
  advance();
  credit_ = cfg_.step_insert_tokens;
}

void Engine::finish(int64_t h) {
  Request& r = get(h);
  if (r.guid >= 0) {
    Cached& c = cached_.at(r.guid);
    if (c.queue.empty()) {
      global_.finish_sequence(c.sid);
    } else {
      c.finished = true;
    }
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
  work_.clear();
  credit_ = cfg_.step_insert_tokens;
  global_ = SuffixTree(cfg_.max_depth);
  if (global_enabled()) {
    const int64_t want = 2 * cfg_.max_cached_tokens + 2;
    global_.reserve_nodes(std::min(static_cast<size_t>(want), kMaxReservedNodes));
  }
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

const Draft& Engine::draft(int64_t h, int max_nodes) {
  Request& r = get(h);
  const std::vector<int32_t>& hist = r.tail;
  // A tree that still waits for some of the request's tokens is matched by
  // walking (sid -1): its tracked suffixes are not the history's suffixes.
  best_in_tree(*r.local, r.queue.empty() ? 0 : -1, hist, max_nodes, 0.0, local_best_);
  global_best_.clear();
  const bool merge = cfg_.merge_drafts && cfg_.use_tree;
  if (global_enabled()) {
    // Unmerged, the global draft wins only with a strictly higher score.
    int sid = -1;
    if (r.guid >= 0) {
      const Cached& c = cached_.at(r.guid);
      if (c.queue.empty()) sid = c.sid;
    }
    best_in_tree(global_, sid, hist, max_nodes, merge ? 0.0 : local_best_.score, global_best_);
  }
  if (merge) {
    if (global_best_.tokens.empty()) return local_best_;
    if (local_best_.tokens.empty()) return global_best_;
    merger_.merge(local_best_, global_best_, max_nodes, merged_);
    return merged_;
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
  for (const auto& kv : cached_) {
    s.pending_tokens += static_cast<int64_t>(kv.second.queue.left());
    s.memory_bytes += static_cast<int64_t>(kv.second.queue.tokens.capacity() * sizeof(int32_t));
  }
  for (const auto& kv : reqs_) {
    const Request& r = kv.second;
    s.local_nodes += r.local->num_nodes() - 1;
    s.local_tokens += r.local->live_tokens();
    s.pending_tokens += static_cast<int64_t>(r.queue.left());
    s.memory_bytes += r.local->memory_bytes() + static_cast<int64_t>(sizeof(SuffixTree)) +
                      static_cast<int64_t>((r.queue.tokens.capacity() + r.tail.capacity()) *
                                           sizeof(int32_t));
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
