#include "shardtrain/train/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "shardtrain/core/error.h"

namespace st {
namespace {

// Margins inside each panel, in pixels: room for the panel title, the tick labels and the axis labels.
constexpr double kLeft = 78, kRight = 18, kTop = 34, kBottom = 46, kTitleBand = 44;

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", v);
  return buf;
}

// The decimals that tell ticks `step` apart.
int decimals_for(double step) { return step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9)); }

struct Extent {
  double min = std::numeric_limits<double>::infinity(), max = -std::numeric_limits<double>::infinity();
  bool empty() const { return !(min <= max); }
  void add(double v) {
    if (!std::isfinite(v)) return;
    min = std::min(min, v);
    max = std::max(max, v);
  }
};

// Maps data to pixels inside one panel's plot area.
struct Frame {
  double x0, x1, y0, y1;  // left, right, bottom, top pixels
  AxisRange xr, yr;
  double px(double x) const { return x0 + (x - xr.lo) / (xr.hi - xr.lo) * (x1 - x0); }
  double py(double y) const { return y0 - (y - yr.lo) / (yr.hi - yr.lo) * (y0 - y1); }
};

std::vector<double> ticks_of(const AxisRange& r) {
  std::vector<double> t;
  const int n = static_cast<int>(std::llround((r.hi - r.lo) / r.step));
  for (int i = 0; i <= n; ++i) t.push_back(r.lo + r.step * i);
  return t;
}

void render_panel(std::string& svg, const ChartPanel& panel, const Frame& f, const ChartOptions& o) {
  // The data edges in full precision for readers of the file (the tick labels round).
  char edges[160];
  std::snprintf(edges, sizeof(edges), " data-xmin=\"%.17g\" data-xmax=\"%.17g\" data-ymin=\"%.17g\" data-ymax=\"%.17g\"",
                f.xr.lo, f.xr.hi, f.yr.lo, f.yr.hi);
  svg += "<g class=\"panel\" id=\"panel-" + xml_escape(panel.id) + "\" data-x0=\"" + num(f.x0) + "\" data-x1=\"" +
         num(f.x1) + "\" data-y0=\"" + num(f.y0) + "\" data-y1=\"" + num(f.y1) + "\"" + edges + ">\n";
  const double cx = (f.x0 + f.x1) / 2;
  svg += "<text class=\"panel-title\" x=\"" + num(cx) + "\" y=\"" + num(f.y1 - 12) +
         "\" text-anchor=\"middle\" font-size=\"14\" font-weight=\"bold\">" + xml_escape(panel.y_label) + "</text>\n";
  // Grid and ticks.
  svg += "<g class=\"grid\" stroke=\"#e3e3e3\" stroke-width=\"1\">\n";
  for (double t : ticks_of(f.xr))
    svg += "<line x1=\"" + num(f.px(t)) + "\" y1=\"" + num(f.y0) + "\" x2=\"" + num(f.px(t)) + "\" y2=\"" + num(f.y1) +
           "\"/>\n";
  for (double t : ticks_of(f.yr))
    svg += "<line x1=\"" + num(f.x0) + "\" y1=\"" + num(f.py(t)) + "\" x2=\"" + num(f.x1) + "\" y2=\"" + num(f.py(t)) +
           "\"/>\n";
  svg += "</g>\n<g class=\"x-axis\" font-size=\"11\" text-anchor=\"middle\">\n";
  for (double t : ticks_of(f.xr))
    svg += "<line x1=\"" + num(f.px(t)) + "\" y1=\"" + num(f.y0) + "\" x2=\"" + num(f.px(t)) + "\" y2=\"" +
           num(f.y0 + 5) + "\" stroke=\"#333\"/><text x=\"" + num(f.px(t)) + "\" y=\"" + num(f.y0 + 18) + "\">" +
           format_tick(t, f.xr) + "</text>\n";
  svg += "<text class=\"axis-label\" x=\"" + num(cx) + "\" y=\"" + num(f.y0 + 36) + "\" font-size=\"12\">" +
         xml_escape(o.x_label) + "</text>\n</g>\n<g class=\"y-axis\" font-size=\"11\" text-anchor=\"end\">\n";
  for (double t : ticks_of(f.yr))
    svg += "<line x1=\"" + num(f.x0 - 5) + "\" y1=\"" + num(f.py(t)) + "\" x2=\"" + num(f.x0) + "\" y2=\"" +
           num(f.py(t)) + "\" stroke=\"#333\"/><text x=\"" + num(f.x0 - 8) + "\" y=\"" + num(f.py(t) + 4) + "\">" +
           format_tick(t, f.yr) + "</text>\n";
  const double cy = (f.y0 + f.y1) / 2, lx = f.x0 - kLeft + 16;
  svg += "<text class=\"axis-label\" x=\"" + num(lx) + "\" y=\"" + num(cy) + "\" font-size=\"12\" text-anchor=\"middle\" "
         "transform=\"rotate(-90 " + num(lx) + " " + num(cy) + ")\">" + xml_escape(panel.y_label) + "</text>\n</g>\n";
  svg += "<rect class=\"frame\" x=\"" + num(f.x0) + "\" y=\"" + num(f.y1) + "\" width=\"" + num(f.x1 - f.x0) +
         "\" height=\"" + num(f.y0 - f.y1) + "\" fill=\"none\" stroke=\"#333\" stroke-width=\"1\"/>\n";
  // The series.
  bool any = false;
  for (const ChartSeries& s : panel.series) {
    if (s.points.empty()) continue;
    any = true;
    std::string pts;
    for (const ChartPoint& p : s.points) pts += (pts.empty() ? "" : " ") + num(f.px(p.x)) + "," + num(f.py(p.y));
    svg += "<polyline class=\"series\" data-series=\"" + xml_escape(s.name) + "\" fill=\"none\" stroke=\"" +
           xml_escape(s.color) + "\" stroke-width=\"1.5\" stroke-linejoin=\"round\" points=\"" + pts + "\"/>\n";
    if (s.markers) {
      svg += "<g class=\"markers\" data-series=\"" + xml_escape(s.name) + "\" fill=\"" + xml_escape(s.color) + "\">";
      for (const ChartPoint& p : s.points)
        svg += "<circle cx=\"" + num(f.px(p.x)) + "\" cy=\"" + num(f.py(p.y)) + "\" r=\"3\"/>";
      svg += "</g>\n";
    }
  }
  if (!any)
    svg += "<text class=\"no-data\" x=\"" + num(cx) + "\" y=\"" + num(cy) +
           "\" text-anchor=\"middle\" font-size=\"13\" fill=\"#888\">no data</text>\n";
  // The legend, top right, when there is more than one series to tell apart.
  if (panel.series.size() > 1) {
    svg += "<g class=\"legend\" font-size=\"11\">\n";
    double y = f.y1 + 16;
    for (const ChartSeries& s : panel.series) {
      const double x = f.x1 - 90;
      svg += "<line x1=\"" + num(x) + "\" y1=\"" + num(y - 4) + "\" x2=\"" + num(x + 18) + "\" y2=\"" + num(y - 4) +
             "\" stroke=\"" + xml_escape(s.color) + "\" stroke-width=\"2\"/><text x=\"" + num(x + 24) + "\" y=\"" +
             num(y) + "\">" + xml_escape(s.name) + "</text>\n";
      y += 16;
    }
    svg += "</g>\n";
  }
  svg += "</g>\n";
}

}  // namespace

AxisRange nice_range(double min, double max, int target) {
  if (!std::isfinite(min) || !std::isfinite(max)) return AxisRange{};
  if (max < min) std::swap(min, max);
  if (max == min) {
    const double pad = min == 0 ? 1.0 : std::abs(min) * 0.1;
    min -= pad;
    max += pad;
  }
  const double raw = (max - min) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  AxisRange r;
  constexpr double kSlack = 1e-9;  // 1.2 / 6 is 0.20000000000000004, and 0.6 / 0.2 is 2.9999999999999996
  r.step = (norm <= 1 + kSlack ? 1 : norm <= 2 + kSlack ? 2 : norm <= 5 + kSlack ? 5 : 10) * mag;
  // A data edge within rounding of a tick is that tick; std::min/max keep lo <= min and max <= hi exactly.
  r.lo = std::min(std::floor(min / r.step + kSlack) * r.step, min);
  r.hi = std::max(std::ceil(max / r.step - kSlack) * r.step, max);
  return r;
}

std::string format_tick(double value, const AxisRange& axis) {
  if (std::abs(value) < axis.step * 1e-6) return "0";
  const double reach = std::max(std::abs(axis.lo), std::abs(axis.hi));
  char buf[48];
  if (reach < 1e-3) {
    std::snprintf(buf, sizeof(buf), "%.3g", value);
    return buf;
  }
  double scale = 1;
  const char* suffix = "";
  if (reach >= 1e9) {
    scale = 1e9, suffix = "G";
  } else if (reach >= 1e6) {
    scale = 1e6, suffix = "M";
  } else if (reach >= 1e4) {
    scale = 1e3, suffix = "k";
  }
  std::snprintf(buf, sizeof(buf), "%.*f%s", decimals_for(axis.step / scale), value / scale, suffix);
  return buf;
}

std::string render_svg_chart(const std::string& title, const std::vector<ChartPanel>& panels,
                             const ChartOptions& o) {
  ST_CHECK(o.columns > 0 && o.panel_width > kLeft + kRight && o.panel_height > kTop + kBottom,
           "render_svg_chart: bad layout");
  // One x range for every panel, so that a step lines up across them.
  Extent xs;
  for (const ChartPanel& p : panels)
    for (const ChartSeries& s : p.series)
      for (const ChartPoint& pt : s.points) {
        ST_CHECK(std::isfinite(pt.x) && std::isfinite(pt.y), "render_svg_chart: series ", s.name, " has a point (",
                 pt.x, ", ", pt.y, ") that is not finite");
        xs.add(pt.x);
      }
  const AxisRange xr = xs.empty() ? AxisRange{} : nice_range(xs.min, xs.max, 6);
  const int rows = (static_cast<int>(panels.size()) + o.columns - 1) / o.columns;
  const int width = o.columns * o.panel_width, height = static_cast<int>(kTitleBand) + rows * o.panel_height;
  std::string svg = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
                    std::to_string(width) + "\" height=\"" + std::to_string(height) + "\" viewBox=\"0 0 " +
                    std::to_string(width) + " " + std::to_string(height) +
                    "\" font-family=\"sans-serif\" fill=\"#222\">\n<title>" + xml_escape(title) + "</title>\n" +
                    "<rect width=\"" + std::to_string(width) + "\" height=\"" + std::to_string(height) +
                    "\" fill=\"#ffffff\"/>\n<text class=\"title\" x=\"" + num(width / 2.0) +
                    "\" y=\"28\" text-anchor=\"middle\" font-size=\"17\" font-weight=\"bold\">" + xml_escape(title) +
                    "</text>\n";
  for (size_t i = 0; i < panels.size(); ++i) {
    const double ox = static_cast<double>(static_cast<int>(i) % o.columns * o.panel_width);
    const double oy = kTitleBand + static_cast<double>(static_cast<int>(i) / o.columns * o.panel_height);
    Extent ys;
    for (const ChartSeries& s : panels[i].series)
      for (const ChartPoint& pt : s.points) ys.add(pt.y);
    const Frame f{ox + kLeft, ox + o.panel_width - kRight, oy + o.panel_height - kBottom, oy + kTop, xr,
                  ys.empty() ? AxisRange{} : nice_range(ys.min, ys.max, 5)};
    render_panel(svg, panels[i], f, o);
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace st
