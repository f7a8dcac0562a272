// A small line-chart writer: panels of (x, y) series on a grid, as one self-contained SVG document (no
// scripts, no external fonts or style sheets; the generic "sans-serif" family), for `shardtrain plot`.
//
//   ChartPanel p{"loss", "loss (nats/token)", {{"loss", "#1f77b4", points, false}}};
//   std::string svg = render_svg_chart("run.jsonl", {p, ...}, ChartOptions{});
//
// Structure, which tests and other tools may rely on:
//   <svg ...><title>TITLE</title> ... <g class="panel" id="panel-ID" data-x0 data-x1 data-y0 data-y1
//   data-xmin data-xmax data-ymin data-ymax> ... <polyline class="series" data-series="NAME" points="x,y ..."/>
// data-x0/x1 are the plot area's left and right pixel columns, data-y0/y1 its bottom and top pixel rows, and
// data-xmin..data-ymax the data values at those edges (the axes' tick-aligned ranges): a point (x, y) is drawn
// at (x0 + (x - xmin) / (xmax - xmin) * (x1 - x0), y0 - (y - ymin) / (ymax - ymin) * (y0 - y1)). One polyline
// per series with every point in order (series with markers also get a circle per point); a panel with no
// points at all says "no data".
#pragma once

#include <string>
#include <vector>

namespace st {

struct ChartPoint {
  double x = 0, y = 0;
};

struct ChartSeries {
  std::string name;   // legend text and data-series
  std::string color;  // any SVG colour, e.g. "#1f77b4"
  std::vector<ChartPoint> points;  // finite values (render_svg_chart checks)
  bool markers = false;  // a circle on every point (for sparse series such as evaluations)
};

struct ChartPanel {
  std::string id;       // [a-z0-9_-]: the group's id is "panel-" + id
  std::string y_label;  // the panel's title and y-axis label
  std::vector<ChartSeries> series;
};

struct ChartOptions {
  std::string x_label = "step";
  int columns = 2;
  int panel_width = 520, panel_height = 320;  // pixels, margins and axis labels included
};

// A tick-aligned axis range: lo and hi are multiples of step (1, 2 or 5 x a power of ten), lo <= min and
// max <= hi, with about `target` intervals. A single value (min == max) gets a range around it.
struct AxisRange {
  double lo = 0, hi = 1, step = 0.2;
};
AxisRange nice_range(double min, double max, int target = 5);

// A tick label on `axis`: "0", "600", "0.0006", "2.5", "3e-05"; with k, M or G on an axis reaching 10,000, 1e6
// or 1e9 ("350k", "1.2M"); as many decimals as the axis's step needs.
std::string format_tick(double value, const AxisRange& axis);

std::string render_svg_chart(const std::string& title, const std::vector<ChartPanel>& panels,
                             const ChartOptions& options = ChartOptions{});

}  // namespace st
