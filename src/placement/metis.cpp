// METIS backend: METIS_PartGraphKway with two constraints on a graph model of the hypergraph.
//
// Graph model (star expansion around the home): every pin of a net is joined to the net's
// token-block vertex by an edge of the net's weight, so a cut edge is one tile reading or
// writing a remote block. This over-counts nets read by several tiles on the same remote
// device (the hypergraph counts each device once); the exact bytes are measured afterwards.
// Nets whose home lies outside the level become a star around their first pin.
#include <algorithm>
#include <cmath>
#include <tuple>

#include "dcp/error.h"
#include "placement/kway.h"

#ifdef DCP_HAVE_METIS
#include <metis.h>
#endif

namespace dcp::placement {

#ifdef DCP_HAVE_METIS
namespace {

// Scales non-negative weights to integers in [0, limit] (positive weights stay >= 1).
std::vector<idx_t> to_idx(const std::vector<double>& w, double limit) {
  const double mx = w.empty() ? 0.0 : *std::max_element(w.begin(), w.end());
  std::vector<idx_t> out(w.size(), 0);
  if (mx <= 0) return out;
  for (size_t i = 0; i < w.size(); ++i)
    if (w[i] > 0) out[i] = std::max<idx_t>(1, static_cast<idx_t>(std::llround(w[i] / mx * limit)));
  return out;
}

class MetisPartitioner final : public Partitioner {
 public:
  std::vector<int32_t> partition(const SubHypergraph& s, const PartCaps& caps, uint64_t seed,
                                 const RefineOptions& /*refine*/) const override {
    const int k = caps.k();
    const int32_t n = s.num_vertices();
    std::vector<int32_t> part(static_cast<size_t>(n), 0);
    if (k <= 1 || n == 0) return part;  // METIS fails on nparts = 1

    // Edges (u, v, w) with u < v, merged.
    std::vector<std::tuple<int32_t, int32_t, double>> edges;
    for (int32_t e = 0; e < s.num_nets(); ++e) {
      const int32_t center = s.pins[s.net_begin[e]];
      for (int64_t i = s.net_begin[e] + 1; i < s.net_begin[e + 1]; ++i) {
        const int32_t v = s.pins[i];
        if (v != center) edges.emplace_back(std::min(center, v), std::max(center, v), s.net_weight[e]);
      }
    }
    std::sort(edges.begin(), edges.end());
    std::vector<std::tuple<int32_t, int32_t, double>> merged;
    for (const auto& ed : edges) {
      if (!merged.empty() && std::get<0>(merged.back()) == std::get<0>(ed) &&
          std::get<1>(merged.back()) == std::get<1>(ed))
        std::get<2>(merged.back()) += std::get<2>(ed);
      else
        merged.push_back(ed);
    }
    std::vector<double> ew_d;
    for (const auto& ed : merged) ew_d.push_back(std::get<2>(ed));
    const std::vector<idx_t> ew = to_idx(ew_d, 1e6);
    std::vector<idx_t> xadj(static_cast<size_t>(n) + 1, 0);
    for (const auto& ed : merged) {
      ++xadj[std::get<0>(ed) + 1];
      ++xadj[std::get<1>(ed) + 1];
    }
    for (int32_t v = 0; v < n; ++v) xadj[v + 1] += xadj[v];
    std::vector<idx_t> adjncy(static_cast<size_t>(xadj.back())), adjwgt(adjncy.size());
    std::vector<idx_t> fill(xadj.begin(), xadj.end() - 1);
    for (size_t i = 0; i < merged.size(); ++i) {
      const auto [u, v, w] = merged[i];
      adjncy[fill[u]] = v;
      adjwgt[fill[u]++] = ew[i];
      adjncy[fill[v]] = u;
      adjwgt[fill[v]++] = ew[i];
    }

    // Two constraints when both are present; a level without memory (or compute) uses one.
    const std::vector<idx_t> wc = to_idx(s.compute, 1e5), wm = to_idx(s.memory, 1e5);
    const bool has_c = std::any_of(wc.begin(), wc.end(), [](idx_t x) { return x > 0; });
    const bool has_m = std::any_of(wm.begin(), wm.end(), [](idx_t x) { return x > 0; });
    idx_t ncon = (has_c && has_m) ? 2 : 1;
    std::vector<idx_t> vwgt;
    std::vector<real_t> ubvec;
    double tot_c = 0, tot_m = 0;
    for (int32_t v = 0; v < n; ++v) {
      tot_c += s.compute[v];
      tot_m += s.memory[v];
    }
    auto ub = [&](double cap, double total) {
      return static_cast<real_t>(std::max(1.001, total > 0 ? cap * k / total : 1.001));
    };
    for (int32_t v = 0; v < n; ++v) {
      if (has_c || !has_m) vwgt.push_back(has_c ? wc[v] : 1);
      if (has_m) vwgt.push_back(wm[v]);
    }
    if (has_c || !has_m) ubvec.push_back(ub(caps.compute[0], tot_c));
    if (has_m) ubvec.push_back(ub(caps.memory[0], tot_m));

    idx_t options[METIS_NOPTIONS];
    METIS_SetDefaultOptions(options);
    options[METIS_OPTION_SEED] = static_cast<idx_t>(seed % 1000003);
    options[METIS_OPTION_OBJTYPE] = METIS_OBJTYPE_CUT;
    idx_t nvtxs = n, nparts = k, objval = 0;
    std::vector<idx_t> out(static_cast<size_t>(n), 0);
    const int rc = METIS_PartGraphKway(&nvtxs, &ncon, xadj.data(), adjncy.empty() ? nullptr : adjncy.data(),
                                       vwgt.data(), nullptr, adjwgt.empty() ? nullptr : adjwgt.data(),
                                       &nparts, nullptr, ubvec.data(), options, &objval, out.data());
    if (rc != METIS_OK)
      raise(ErrorKind::System, "placement: METIS_PartGraphKway failed with code " +
                                   std::to_string(rc) + " (k = " + std::to_string(k) +
                                   ", vertices = " + std::to_string(n) + ")");
    for (int32_t v = 0; v < n; ++v) part[v] = static_cast<int32_t>(out[v]);
    return part;
  }
};

}  // namespace

std::unique_ptr<Partitioner> make_metis_partitioner() { return std::make_unique<MetisPartitioner>(); }
#else
std::unique_ptr<Partitioner> make_metis_partitioner() {
  raise(ErrorKind::Unsupported, "placement: this build has no METIS (install libmetis-dev)");
}
#endif

}  // namespace dcp::placement
