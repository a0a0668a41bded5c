// SVG pictures of a plan (see dcp/plan_svg.h). Plain string building; no dependencies.
#include "dcp/plan_svg.h"

#include <algorithm>
#include <fstream>
#include <numeric>

#include <fmt/core.h>

#include "dcp/error.h"

namespace dcp {
namespace {

// Distinct hues for up to ~16 devices, repeating in lightness beyond.
std::string device_colour(int d, double lightness = 0.5) {
  const int hue = (d * 137) % 360;  // golden-angle spread
  const double l = lightness - 0.08 * ((d / 16) % 3);
  return fmt::format("hsl({},70%,{:.0f}%)", hue, l * 100);
}

}  // namespace

std::string plan_to_svg(const Plan& plan, const SvgOptions& opts, const SimResult* sim) {
  const BlockTable& t = plan.table;
  const Placement& pl = plan.placement;
  const int P = plan.header.world_size;
  std::string body;
  // Sequences by length, longest first.
  std::vector<int> seqs(t.num_sequences());
  std::iota(seqs.begin(), seqs.end(), 0);
  std::stable_sort(seqs.begin(), seqs.end(), [&](int a, int b) { return t.seq_length[a] > t.seq_length[b]; });
  const int shown = std::min<int>(opts.max_sequences, static_cast<int>(seqs.size()));
  int max_blocks = 1;
  for (int s : seqs) max_blocks = std::max(max_blocks, t.seq_first_block[s + 1] - t.seq_first_block[s]);
  const double cell = std::clamp(static_cast<double>(opts.grid_px) / max_blocks, 1.5, 24.0);
  const int groups = opts.all_head_groups ? t.groups.num_groups : 1;
  // Index of the first tile of each (seq, group) in the table's (seq, group, q, kv) order.
  std::vector<size_t> first_tile(static_cast<size_t>(t.num_sequences()) * t.groups.num_groups + 1, t.tiles.size());
  for (size_t i = t.tiles.size(); i-- > 0;)
    first_tile[static_cast<size_t>(t.tiles[i].seq) * t.groups.num_groups + t.tiles[i].head_group] = i;
  double x = 10, y = 40, row_h = 0;
  const double width = 1100;
  for (int k = 0; k < shown; ++k) {
    const int s = seqs[k];
    const int b0 = t.seq_first_block[s], nb = t.seq_first_block[s + 1] - b0;
    for (int g = 0; g < groups; ++g) {
      const double side = nb * cell;
      if (x + side + 20 > width) {
        x = 10;
        y += row_h + 30;
        row_h = 0;
      }
      body += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="10">seq {} ({} tok){}</text>)", x, y - 8, s,
                          t.seq_length[s], groups > 1 ? fmt::format(" g{}", g) : "");
      body += "\n";
      const double gx = x + 6, gy = y + 6;  // leave room for the home strips
      for (int b = 0; b < nb; ++b) {
        const std::string c = device_colour(pl.block_home[b0 + b]);
        body += fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="4" height="{:.2f}" fill="{}"/>)", x, gy + b * cell, cell, c);
        body += fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="{:.2f}" height="4" fill="{}"/>)", gx + b * cell, y, cell, c);
      }
      body += fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="none" stroke="#ccc"/>)",
                          gx, gy, side, side);
      body += "\n";
      const size_t key = static_cast<size_t>(s) * t.groups.num_groups + g;
      for (size_t i = first_tile[key]; i < t.tiles.size() && t.tiles[i].seq == s && t.tiles[i].head_group == g; ++i) {
        const Tile& tile = t.tiles[i];
        const double cx = gx + (tile.kv_block - b0) * cell, cy = gy + (tile.q_block - b0) * cell;
        const std::string c = device_colour(pl.tile_device[i], tile.kind == TileKind::Partial ? 0.72 : 0.5);
        if (tile.kind == TileKind::CausalDiagonal)
          body += fmt::format(R"(<polygon points="{:.1f},{:.1f} {:.1f},{:.1f} {:.1f},{:.1f}" fill="{}"/>)", cx, cy, cx,
                              cy + cell, cx + cell, cy + cell, c);
        else
          body += fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="{:.2f}" height="{:.2f}" fill="{}"/>)", cx, cy, cell,
                              cell, c);
      }
      body += "\n";
      x += side + 30;
      row_h = std::max(row_h, side + 10);
    }
  }
  y += row_h + 20;
  if (shown < static_cast<int>(seqs.size()))
    body += fmt::format(R"(<text x="10" y="{:.1f}" font-size="10">{} shorter sequences not drawn</text>)", y,
                        static_cast<int>(seqs.size()) - shown);
  y += 20;
  // Per device bars.
  std::vector<double> flops(P, 0.0);
  for (size_t i = 0; i < t.tiles.size(); ++i) flops[pl.tile_device[i]] += t.tile_flops_fwd(t.tiles[i]);
  std::vector<DeviceMemory> mem(P);
  int64_t max_mem = 1;
  for (int d = 0; d < P; ++d) {
    mem[d] = plan_memory(plan, d);
    max_mem = std::max(max_mem, mem[d].peak_bytes);
  }
  const double max_flops = std::max(1.0, *std::max_element(flops.begin(), flops.end()));
  const double bar_w = 300;
  body += fmt::format(R"(<text x="10" y="{:.1f}" font-size="11">device: memory (owned | fwd slots | bwd slots beyond fwd), max {:.1f} MiB; forward FLOPs{}</text>)",
                      y, static_cast<double>(max_mem) / (1 << 20), sim ? "; simulated fwd+bwd ms" : "");
  body += "\n";
  y += 8;
  for (int d = 0; d < P; ++d) {
    const double yy = y + d * 14;
    const double scale = bar_w / static_cast<double>(max_mem);
    const double w_local = static_cast<double>(mem[d].local_bytes) * scale;
    const double w_fwd = static_cast<double>(mem[d].fwd.slots_total_bytes) * scale;
    const double w_bwd = static_cast<double>(std::max<int64_t>(0, mem[d].bwd.slots_total_bytes - mem[d].fwd.slots_total_bytes)) * scale;
    body += fmt::format(R"(<rect x="10" y="{:.1f}" width="10" height="10" fill="{}"/><text x="24" y="{:.1f}" font-size="9">{}</text>)",
                        yy, device_colour(d), yy + 9, d);
    body += fmt::format(R"(<rect x="44" y="{:.1f}" width="{:.1f}" height="10" fill="#777"/>)", yy, w_local);
    body += fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="10" fill="#4a90d9"/>)", 44 + w_local, yy, w_fwd);
    body += fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="10" fill="#d98b4a"/>)", 44 + w_local + w_fwd, yy, w_bwd);
    body += fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="10" fill="{}"/>)", 44 + bar_w + 20, yy,
                        flops[d] / max_flops * bar_w, device_colour(d));
    if (sim != nullptr && d < static_cast<int>(sim->devices.size()))
      body += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="9">{:.2f}</text>)", 44 + 2 * bar_w + 30, yy + 9,
                          (sim->devices[d].finish_s[0] + sim->devices[d].finish_s[1]) * 1e3);
    body += "\n";
  }
  y += P * 14 + 10;
  const std::string title = fmt::format("{} plan: {} devices, {} token blocks, {} tiles, {} stages", plan.header.method,
                                        P, t.num_token_blocks(), t.tiles.size(),
                                        plan.header.options.schedule.num_comm_stages + 1);
  return fmt::format(R"(<svg xmlns="http://www.w3.org/2000/svg" width="{:.0f}" height="{:.0f}" font-family="sans-serif">)"
                     "\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
                     R"(<text x="10" y="18" font-size="13">{}</text>)"
                     "\n{}</svg>\n",
                     width, y, title, body);
}

void write_svg(const Plan& plan, const std::string& path, const SvgOptions& opts, const SimResult* sim) {
  std::ofstream f(path);
  if (!f) raise(ErrorKind::System, path + ": cannot open for writing");
  f << plan_to_svg(plan, opts, sim);
  if (!f) raise(ErrorKind::System, path + ": write failed");
}

}  // namespace dcp
