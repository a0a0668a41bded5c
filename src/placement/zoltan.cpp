// Zoltan PHG backend (optional at build time): a true hypergraph partitioner as a reference.
//
// Model: objects = the level's vertices (tiles and token blocks), hyperedges = its nets
// (compressed-edge format, global ids = local indices), edge weight = the net's objective
// weight (bytes, x inter weight where the level counts that). PHG minimises connectivity-1 of
// that hypergraph, as our objective does, except for "external" nets (home on another node):
// PHG cannot see the fixed outside part, so it costs them one part too little; the driver
// measures the exact bytes afterwards.
// Weights: PHG balances one weight per object (given several it warns and uses the first), so
// each vertex gets compute/total compute + memory/total memory: tiles carry only the first
// term, token blocks only the second, and a part at its share of both holds 2/k of the total.
// The two constraints are then enforced by the driver's repair, as for every backend.
// MPI: Zoltan needs it initialised. We initialise it (MPI_Init_thread, serialised threads) only
// when nobody has, and finalise at exit only what we initialised; the partition itself runs on
// MPI_COMM_SELF, so it is serial and independent of any other rank.
#include "dcp/error.h"
#include "placement/kway.h"

#ifdef DCP_HAVE_ZOLTAN
#include <trilinos/zoltan.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>

// Zoltan's random generator (used by PHG's matching and initial partitioning) is one global
// state that runs on from call to call; it is not in the public headers. Re-seeding it before
// each partition makes equal inputs give equal placements.
extern "C" void Zoltan_Srand(unsigned int seed, unsigned int* state);
#endif

namespace dcp::placement {

#ifdef DCP_HAVE_ZOLTAN
namespace {

void finalize_mpi_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// Once per process: MPI (if nobody initialised it) and Zoltan.
void ensure_zoltan() {
  static std::once_flag once;
  static std::string failure;
  std::call_once(once, [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int argc = 0, provided = 0;
      char** argv = nullptr;
      if (MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
        failure = "MPI_Init_thread failed";
        return;
      }
      std::atexit(finalize_mpi_at_exit);
    }
    float version = 0;
    if (Zoltan_Initialize(0, nullptr, &version) != ZOLTAN_OK) failure = "Zoltan_Initialize failed";
  });
  if (!failure.empty()) raise(ErrorKind::System, "placement: zoltan: " + failure);
}

struct Instance {
  const SubHypergraph* s = nullptr;
  std::vector<float> vertex_weight;
  std::vector<float> net_weight;
};

int num_obj(void* data, int* ierr) {
  *ierr = ZOLTAN_OK;
  return static_cast<const Instance*>(data)->s->num_vertices();
}

void obj_list(void* data, int /*num_gid*/, int /*num_lid*/, ZOLTAN_ID_PTR gids, ZOLTAN_ID_PTR lids,
              int wdim, float* wgts, int* ierr) {
  const Instance& in = *static_cast<const Instance*>(data);
  for (int32_t v = 0; v < in.s->num_vertices(); ++v) {
    gids[v] = static_cast<ZOLTAN_ID_TYPE>(v);
    lids[v] = static_cast<ZOLTAN_ID_TYPE>(v);
    if (wdim == 1) wgts[v] = in.vertex_weight[v];
  }
  *ierr = wdim <= 1 ? ZOLTAN_OK : ZOLTAN_FATAL;
}

void hg_size_cs(void* data, int* num_lists, int* num_pins, int* format, int* ierr) {
  const SubHypergraph& s = *static_cast<const Instance*>(data)->s;
  *num_lists = s.num_nets();
  *num_pins = static_cast<int>(s.pins.size());
  *format = ZOLTAN_COMPRESSED_EDGE;
  *ierr = ZOLTAN_OK;
}

void hg_cs(void* data, int /*num_gid*/, int num_lists, int num_pins, int format,
           ZOLTAN_ID_PTR edge_gid, int* edge_ptr, ZOLTAN_ID_PTR pin_gid, int* ierr) {
  const SubHypergraph& s = *static_cast<const Instance*>(data)->s;
  if (num_lists != s.num_nets() || num_pins != static_cast<int>(s.pins.size()) ||
      format != ZOLTAN_COMPRESSED_EDGE) {
    *ierr = ZOLTAN_FATAL;
    return;
  }
  for (int32_t e = 0; e < s.num_nets(); ++e) {
    edge_gid[e] = static_cast<ZOLTAN_ID_TYPE>(e);
    edge_ptr[e] = static_cast<int>(s.net_begin[e]);
  }
  for (size_t i = 0; i < s.pins.size(); ++i) pin_gid[i] = static_cast<ZOLTAN_ID_TYPE>(s.pins[i]);
  *ierr = ZOLTAN_OK;
}

void hg_size_edge_wts(void* data, int* num_edges, int* ierr) {
  *num_edges = static_cast<const Instance*>(data)->s->num_nets();
  *ierr = ZOLTAN_OK;
}

void hg_edge_wts(void* data, int /*num_gid*/, int /*num_lid*/, int num_edges, int wdim,
                 ZOLTAN_ID_PTR gids, ZOLTAN_ID_PTR lids, float* wgts, int* ierr) {
  const Instance& in = *static_cast<const Instance*>(data);
  if (num_edges != in.s->num_nets() || wdim != 1) {
    *ierr = ZOLTAN_FATAL;
    return;
  }
  for (int e = 0; e < num_edges; ++e) {
    gids[e] = static_cast<ZOLTAN_ID_TYPE>(e);
    if (lids != nullptr) lids[e] = static_cast<ZOLTAN_ID_TYPE>(e);
    wgts[e] = in.net_weight[static_cast<size_t>(e)];
  }
  *ierr = ZOLTAN_OK;
}

// Owns a Zoltan_Struct and the lists one call returns.
class ZoltanRun {
 public:
  ZoltanRun() : zz_(Zoltan_Create(MPI_COMM_SELF)) {
    if (zz_ == nullptr) raise(ErrorKind::System, "placement: zoltan: Zoltan_Create failed");
  }
  ~ZoltanRun() {
    Zoltan_LB_Free_Part(&imp_gids, &imp_lids, &imp_procs, &imp_parts);
    Zoltan_LB_Free_Part(&exp_gids, &exp_lids, &exp_procs, &exp_parts);
    Zoltan_Destroy(&zz_);
  }
  ZoltanRun(const ZoltanRun&) = delete;
  ZoltanRun& operator=(const ZoltanRun&) = delete;

  void set(const char* name, const std::string& value) {
    if (Zoltan_Set_Param(zz_, name, value.c_str()) != ZOLTAN_OK)
      raise(ErrorKind::System, std::string("placement: zoltan: parameter ") + name + " = " +
                                   value + " rejected");
  }
  Zoltan_Struct* get() { return zz_; }

  ZOLTAN_ID_PTR imp_gids = nullptr, imp_lids = nullptr, exp_gids = nullptr, exp_lids = nullptr;
  int *imp_procs = nullptr, *imp_parts = nullptr, *exp_procs = nullptr, *exp_parts = nullptr;

 private:
  Zoltan_Struct* zz_;
};

class ZoltanPartitioner final : public Partitioner {
 public:
  std::vector<int32_t> partition(const SubHypergraph& s, const PartCaps& caps,
                                 uint64_t seed, const RefineOptions& /*refine*/) const override {
    const int k = caps.k();
    const int32_t n = s.num_vertices();
    std::vector<int32_t> part(static_cast<size_t>(n), 0);
    if (k <= 1 || n == 0) return part;
    ensure_zoltan();

    Instance in;
    in.s = &s;
    double tot_c = 0, tot_m = 0;
    for (int32_t v = 0; v < n; ++v) {
      tot_c += s.compute[v];
      tot_m += s.memory[v];
    }
    // Scaled so that a vertex weighs about 1 on average (floats keep their precision).
    in.vertex_weight.resize(static_cast<size_t>(n));
    for (int32_t v = 0; v < n; ++v) {
      const double w = (tot_c > 0 ? s.compute[v] / tot_c : 0.0) + (tot_m > 0 ? s.memory[v] / tot_m : 0.0);
      in.vertex_weight[v] = static_cast<float>(w * n);
    }
    const double max_w = s.net_weight.empty() ? 0.0 : *std::max_element(s.net_weight.begin(), s.net_weight.end());
    in.net_weight.resize(s.net_weight.size());
    for (size_t e = 0; e < s.net_weight.size(); ++e)
      in.net_weight[e] = max_w > 0 ? static_cast<float>(s.net_weight[e] / max_w * 1e6) : 1.0f;
    // The tolerance PHG aims at: the tighter of the two relative caps.
    double tol = 1e300;
    if (tot_c > 0) tol = std::min(tol, caps.compute[0] * k / tot_c);
    if (tot_m > 0) tol = std::min(tol, caps.memory[0] * k / tot_m);
    tol = std::max(1.001, tol >= 1e299 ? 1.1 : tol);

    ZoltanRun z;
    z.set("DEBUG_LEVEL", "0");
    z.set("LB_METHOD", "HYPERGRAPH");
    z.set("HYPERGRAPH_PACKAGE", "PHG");
    z.set("LB_APPROACH", "PARTITION");
    z.set("PHG_CUT_OBJECTIVE", "CONNECTIVITY");
    z.set("NUM_GID_ENTRIES", "1");
    z.set("NUM_LID_ENTRIES", "1");
    z.set("OBJ_WEIGHT_DIM", "1");
    z.set("EDGE_WEIGHT_DIM", "1");
    z.set("RETURN_LISTS", "PARTITION ASSIGNMENTS");
    z.set("NUM_GLOBAL_PARTS", std::to_string(k));
    z.set("IMBALANCE_TOL", std::to_string(tol));
    Zoltan_Set_Num_Obj_Fn(z.get(), num_obj, &in);
    Zoltan_Set_Obj_List_Fn(z.get(), obj_list, &in);
    Zoltan_Set_HG_Size_CS_Fn(z.get(), hg_size_cs, &in);
    Zoltan_Set_HG_CS_Fn(z.get(), hg_cs, &in);
    Zoltan_Set_HG_Size_Edge_Wts_Fn(z.get(), hg_size_edge_wts, &in);
    Zoltan_Set_HG_Edge_Wts_Fn(z.get(), hg_edge_wts, &in);

    uint64_t st = seed;
    Zoltan_Srand(static_cast<unsigned int>(splitmix64(st) & 0x7fffffffU), nullptr);
    int changes = 0, num_gid = 0, num_lid = 0, num_imp = 0, num_exp = 0;
    const int rc = Zoltan_LB_Partition(z.get(), &changes, &num_gid, &num_lid, &num_imp, &z.imp_gids,
                                       &z.imp_lids, &z.imp_procs, &z.imp_parts, &num_exp,
                                       &z.exp_gids, &z.exp_lids, &z.exp_procs, &z.exp_parts);
    if (rc != ZOLTAN_OK)
      raise(ErrorKind::System, "placement: zoltan: Zoltan_LB_Partition failed with code " +
                                   std::to_string(rc) + " (k = " + std::to_string(k) +
                                   ", vertices = " + std::to_string(n) + ")");
    // "Partition assignments": the export lists name every object with its part. Check that
    // each vertex appears exactly once with a part in range; anything else is a library fault.
    if (num_exp != n)
      raise(ErrorKind::InvalidPlan, "placement: zoltan returned " + std::to_string(num_exp) +
                                        " assignments for " + std::to_string(n) + " vertices");
    std::vector<uint8_t> seen(static_cast<size_t>(n), 0);
    for (int i = 0; i < num_exp; ++i) {
      const auto v = static_cast<int64_t>(z.exp_gids[i]);
      const int p = z.exp_parts[i];
      if (v < 0 || v >= n || seen[v] || p < 0 || p >= k)
        raise(ErrorKind::InvalidPlan, "placement: zoltan returned a bad assignment (vertex " +
                                          std::to_string(v) + ", part " + std::to_string(p) +
                                          ", k = " + std::to_string(k) + ")");
      seen[v] = 1;
      part[v] = p;
    }
    return part;
  }
};

}  // namespace

std::unique_ptr<Partitioner> make_zoltan_partitioner() {
  return std::make_unique<ZoltanPartitioner>();
}
#else
std::unique_ptr<Partitioner> make_zoltan_partitioner() {
  raise(ErrorKind::Unsupported,
        "placement: this build has no Zoltan (install libtrilinos-zoltan-dev and MPI)");
}
#endif

}  // namespace dcp::placement
