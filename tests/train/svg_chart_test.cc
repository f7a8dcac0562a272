// The chart writer's axes: tick-aligned ranges and tick labels. (The SVG document itself is parsed as XML by
// tests/app/plot_test.py.)
#include "shardtrain/train/svg_chart.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>

namespace st {
namespace {

void expect_range(const AxisRange& r, double lo, double hi, double step) {
  EXPECT_DOUBLE_EQ(r.lo, lo);
  EXPECT_DOUBLE_EQ(r.hi, hi);
  EXPECT_DOUBLE_EQ(r.step, step);
}

TEST(SvgChart, NiceRangeCoversTheDataOnRoundTicks) {
  expect_range(nice_range(1, 600, 6), 0, 600, 100);
  expect_range(nice_range(0.13, 0.97, 5), 0, 1, 0.2);
  expect_range(nice_range(2.04, 5.52, 5), 2, 6, 1);
  expect_range(nice_range(0.6, 1.8, 6), 0.6, 1.8, 0.2);
  expect_range(nice_range(-3, 7, 5), -4, 8, 2);
  expect_range(nice_range(1e-5, 6e-4, 5), 0, 6e-4, 2e-4);
  expect_range(nice_range(5, 5, 5), 4.4, 5.6, 0.2);  // one value: 4.5 to 5.5 around it, on ticks
  expect_range(nice_range(0, 0, 5), -1, 1, 0.5);
  const std::pair<double, double> edges[] = {{0.6, 1.8}, {0.3, 0.9}, {0.7, 2.1}, {1e-5, 6e-4}};
  for (const auto& [lo, hi] : edges) {
    const AxisRange r = nice_range(lo, hi, 6);
    EXPECT_LE(r.lo, lo);
    EXPECT_GE(r.hi, hi);
  }
}

TEST(SvgChart, TickLabels) {
  const AxisRange steps{0, 600, 100};
  EXPECT_EQ(format_tick(0, steps), "0");
  EXPECT_EQ(format_tick(300, steps), "300");
  const AxisRange loss{2, 6, 0.5};
  EXPECT_EQ(format_tick(2.5, loss), "2.5");
  EXPECT_EQ(format_tick(3, loss), "3.0");
  const AxisRange lr{0, 6e-3, 1e-3};
  EXPECT_EQ(format_tick(4e-3, lr), "0.004");
  const AxisRange tiny{0, 6e-5, 1e-5};
  EXPECT_EQ(format_tick(3e-5, tiny), "3e-05");
  const AxisRange tok{0, 600000, 100000};
  EXPECT_EQ(format_tick(300000, tok), "300k");
  const AxisRange big{0, 1.4e6, 2e5};
  EXPECT_EQ(format_tick(1.2e6, big), "1.2M");
  EXPECT_EQ(format_tick(1e-12, big), "0");
}

TEST(SvgChart, EmptyPanelSaysNoDataAndTextIsEscaped) {
  const std::string svg = render_svg_chart("a<b & \"c\"", {ChartPanel{"lr", "learning rate", {{"lr", "#000", {}}}}});
  EXPECT_NE(svg.find("<title>a&lt;b &amp; &quot;c&quot;</title>"), std::string::npos) << svg;
  EXPECT_NE(svg.find(">no data</text>"), std::string::npos);
  EXPECT_EQ(svg.find("<polyline"), std::string::npos);
  EXPECT_EQ(svg.find("<script"), std::string::npos);
}

}  // namespace
}  // namespace st
