// `shardtrain plot METRICS.jsonl [--out FILE.svg]`: the curves of a run's metrics file (log.metrics) as one
// self-contained SVG a browser shows: loss with val_loss, tokens/s, learning rate and gradient norm against
// step, one panel each. Reading follows train/metrics_file.h (a resumed run's repeated steps: the last record
// wins); drawing is train/svg_chart.h. Single-process.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
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
    "usage: shardtrain plot METRICS.jsonl [--out FILE.svg]\n"
    "  draws loss and val_loss, tokens/s, lr and grad_norm against step from a log.metrics file as an SVG\n"
    "  (default --out: METRICS with the extension .svg). Steps that appear more than once (a resumed run appends)\n"
    "  are drawn with their last record. A chart plot drew earlier at FILE.svg is replaced; any other file there is\n"
    "  refused.\n";

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

std::vector<st::ChartPoint> points_of(const st::MetricsSeries& m, const std::string& key) {
  std::vector<st::ChartPoint> out;
  for (const st::SeriesPoint& p : m.series.at(key)) out.push_back({static_cast<double>(p.step), p.value});
  return out;
}

}  // namespace

int cmd_plot(const std::vector<std::string>& args) {
  std::optional<std::string> in, out;
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
    } else if (in) {
      ST_BAD_INPUT("plot: one metrics file at a time (got '", *in, "' and '", a, "')");
    } else {
      in = a;
    }
  }
  if (!in) ST_BAD_INPUT("plot: no metrics file given\n", kPlotUsage);
  if (!out) out = std::filesystem::path(*in).replace_extension(".svg").string();
  if (*out == *in) ST_BAD_INPUT("plot: --out ", *out, " is the metrics file itself");

  const st::MetricsSeries m = st::read_metrics_series(*in, {"loss", "val_loss", "tokens_per_s", "lr", "grad_norm"});
  std::vector<st::ChartPanel> panels(4);
  panels[0] = {"loss", "loss (nats/token)",
               {{"loss", "#1f77b4", points_of(m, "loss"), false}, {"val_loss", "#d62728", points_of(m, "val_loss"), true}}};
  panels[1] = {"tokens_per_s", "tokens/s", {{"tokens_per_s", "#2ca02c", points_of(m, "tokens_per_s"), false}}};
  panels[2] = {"lr", "learning rate", {{"lr", "#9467bd", points_of(m, "lr"), false}}};
  panels[3] = {"grad_norm", "gradient norm (before clipping)", {{"grad_norm", "#ff7f0e", points_of(m, "grad_norm"), false}}};
  const std::string title = st::str_cat(kTitle, std::filesystem::path(*in).filename().string(), " (steps ",
                                        m.first_step, "-", m.last_step, ")");
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
  std::printf("plot: wrote %s: %lld steps (%lld-%lld), %zu loss and %zu val_loss points", out->c_str(),
              static_cast<long long>(m.steps), static_cast<long long>(m.first_step),
              static_cast<long long>(m.last_step), m.series.at("loss").size(), m.series.at("val_loss").size());
  if (m.replaced_steps > 0)
    std::printf("; %lld step(s) appear more than once (a resumed run), drawn with their last record",
                static_cast<long long>(m.replaced_steps));
  std::printf("\n");
  return st::kExitOk;
}
