// `shardtrain plot METRICS.jsonl... [--out FILE.svg]`: the curves of a run's metrics file (log.metrics) as one
// self-contained SVG a browser shows: loss with val_loss, tokens/s, learning rate and gradient norm against
// step, one panel each. Several files draw their runs over each other, a colour a run, named by file (comparing
// runs: bf16 against FP8, one setting against another). Reading follows train/metrics_file.h (a resumed run's
// repeated steps: the last record wins); drawing is train/svg_chart.h. Single-process.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "shardtrain/ckpt/file_io.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/new_file.h"
#include "shardtrain/train/metrics_file.h"
#include "shardtrain/train/svg_chart.h"

namespace {

constexpr const char* kPlotUsage =
    "usage: shardtrain plot METRICS.jsonl... [--out FILE.svg]\n"
    "  draws loss and val_loss, tokens/s, lr and grad_norm against step from a log.metrics file as an SVG\n"
    "  (default --out: METRICS with the extension .svg). Several files draw their runs over each other, each in a\n"
    "  colour of its own and named by its file's stem; they need --out. Steps that appear more than once (a resumed\n"
    "  run appends) are drawn with their last record. A chart plot drew earlier at FILE.svg is replaced; any other\n"
    "  file there is refused.\n";

// Every chart's title starts with this: how plot knows a chart it drew earlier.
constexpr const char* kTitle = "shardtrain metrics: ";

// True if `path` is a chart plot drew: an SVG whose <title> (in its first 1 KiB) starts with kTitle.
bool is_plot_chart(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::string head(1024, '\0');
  f.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(f.gcount()));
  return head.rfind("<?xml", 0) == 0 && head.find("<svg") != std::string::npos &&
         head.find(std::string("<title>") + kTitle) != std::string::npos;
}

// One colour a run when several are drawn (matplotlib's tab10, which the single-run chart's colours come from too).
constexpr const char* kRunColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

std::vector<st::ChartPoint> points_of(const st::MetricsSeries& m, const std::string& key) {
  std::vector<st::ChartPoint> out;
  for (const st::SeriesPoint& p : m.series.at(key)) out.push_back({static_cast<double>(p.step), p.value});
  return out;
}

}  // namespace

int cmd_plot(const std::vector<std::string>& args) {
  std::vector<std::string> in;
  std::optional<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kPlotUsage, stdout);
      return st::kExitOk;
    }
    if (a == "--out") {
      if (i + 1 >= args.size()) ST_BAD_INPUT("plot: --out needs a file name");
      out = args[++i];
    } else if (a.rfind("--out=", 0) == 0) {
      out = a.substr(std::strlen("--out="));
    } else if (a.rfind("--", 0) == 0) {
      ST_BAD_INPUT("plot: unknown option '", a, "' (expected --out FILE)");
    } else {
      in.push_back(a);
    }
  }
  if (in.empty()) ST_BAD_INPUT("plot: no metrics file given\n", kPlotUsage);
  if (in.size() > std::size(kRunColors))
    ST_BAD_INPUT("plot: ", in.size(), " metrics files; one chart draws at most ", std::size(kRunColors), " runs");
  if (!out && in.size() > 1) ST_BAD_INPUT("plot: ", in.size(), " metrics files need --out FILE.svg");
  if (!out) out = std::filesystem::path(in[0]).replace_extension(".svg").string();
  for (const std::string& f : in)
    if (*out == f) ST_BAD_INPUT("plot: --out ", *out, " is a metrics file itself");

  const std::vector<std::string> keys = {"loss", "val_loss", "tokens_per_s", "lr", "grad_norm"};
  std::vector<st::ChartPanel> panels(4);
  panels[0] = {"loss", "loss (nats/token)", {}};
  panels[1] = {"tokens_per_s", "tokens/s", {}};
  panels[2] = {"lr", "learning rate", {}};
  panels[3] = {"grad_norm", "gradient norm (before clipping)", {}};
  std::string names;
  int64_t first_step = 0, last_step = 0;
  std::vector<st::MetricsSeries> runs;
  for (size_t r = 0; r < in.size(); ++r) {
    const st::MetricsSeries m = st::read_metrics_series(in[r], keys);
    const bool one = in.size() == 1;
    // One run keeps a colour a quantity; several take a colour a run, the series named "<file stem> <quantity>".
    const std::string prefix = one ? "" : std::filesystem::path(in[r]).stem().string() + " ";
    const auto color = [&](const char* own) { return one ? std::string(own) : std::string(kRunColors[r]); };
    panels[0].series.push_back({prefix + "loss", color("#1f77b4"), points_of(m, "loss"), false});
    panels[0].series.push_back({prefix + "val_loss", color("#d62728"), points_of(m, "val_loss"), true});
    panels[1].series.push_back({prefix + "tokens_per_s", color("#2ca02c"), points_of(m, "tokens_per_s"), false});
    panels[2].series.push_back({prefix + "lr", color("#9467bd"), points_of(m, "lr"), false});
    panels[3].series.push_back({prefix + "grad_norm", color("#ff7f0e"), points_of(m, "grad_norm"), false});
    names += (r == 0 ? "" : ", ") + std::filesystem::path(in[r]).filename().string();
    first_step = r == 0 ? m.first_step : std::min(first_step, m.first_step);
    last_step = r == 0 ? m.last_step : std::max(last_step, m.last_step);
    runs.push_back(m);
  }
  const std::string title = st::str_cat(kTitle, names, " (steps ", first_step, "-", last_step, ")");
  const std::string svg = st::render_svg_chart(title, panels);

  // A directory that is missing or a file is bad input; a write that fails (a full disk, ulimit -f) is a fault
  // naming the file and the OS's error, and leaves no half-written chart. A chart plot drew earlier is replaced (a
  // refreshed plot of a growing run); any other file is refused, and kept.
  st::check_output_dir(*out, "plot --out");
  std::error_code ec;
  if (st::path_exists(*out) &&
      !(std::filesystem::is_regular_file(std::filesystem::symlink_status(*out, ec)) && is_plot_chart(*out)))
    ST_BAD_INPUT("plot --out ", *out, ": exists and is not a chart plot drew (an SVG titled \"", kTitle,
                 "...\"); shardtrain writes only new files: remove it, or name another --out");
  if (st::path_exists(*out))
    st::write_file_atomic(*out, svg);
  else
    st::write_new_file_atomic(*out, svg, "plot --out");
  for (size_t r = 0; r < runs.size(); ++r) {
    const st::MetricsSeries& m = runs[r];
    std::printf("plot: wrote %s: %s%lld steps (%lld-%lld), %zu loss and %zu val_loss points", out->c_str(),
                runs.size() > 1 ? (in[r] + ": ").c_str() : "", static_cast<long long>(m.steps),
                static_cast<long long>(m.first_step), static_cast<long long>(m.last_step), m.series.at("loss").size(),
                m.series.at("val_loss").size());
    if (m.replaced_steps > 0)
      std::printf("; %lld step(s) appear more than once (a resumed run), drawn with their last record",
                  static_cast<long long>(m.replaced_steps));
    std::printf("\n");
  }
  return st::kExitOk;
}
