// Charts as inline SVG strings, for self-contained HTML reports (no script, no
// network): line charts, stacked bars, sparklines. Text is escaped.
#pragma once

#include <string>
#include <vector>

namespace shardlm::report {

struct Series {
  std::string name;
  std::vector<double> x, y;  // same length; non-finite points are skipped
  std::string color;         // "" : from the palette
  bool points_only = false;  // markers instead of a line (sparse series: val loss)
};

struct LineChart {
  std::string title, x_label, y_label;
  std::vector<Series> series;
  int width = 640, height = 300;
};
std::string line_chart_svg(const LineChart& chart);

// Bars side by side, each a stack of segments (one per category, same order in
// every bar). values[c][b]: segment c of bar b (>= 0).
struct StackedBars {
  std::string title, y_label;
  std::vector<std::string> bars;        // labels under the bars
  std::vector<std::string> categories;  // legend
  std::vector<std::vector<double>> values;
  std::vector<std::string> colors;      // per category ("" : palette)
  int width = 640, height = 320;
};
std::string stacked_bars_svg(const StackedBars& chart);

// A small chart of one series with its last value and range, for "every series".
std::string sparkline_svg(const std::string& title, const std::vector<double>& x,
                          const std::vector<double>& y);

std::string escape_html(const std::string& text);
std::string palette_color(size_t index);

// Axis ticks: about `count` round values covering [lo, hi], at least min_step apart
// (1: whole numbers, for steps).
std::vector<double> nice_ticks(double lo, double hi, int count, double min_step = 0);
std::string format_tick(double value);

}  // namespace shardlm::report
