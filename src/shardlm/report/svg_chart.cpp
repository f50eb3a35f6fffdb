#include "shardlm/report/svg_chart.hpp"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <limits>

namespace shardlm::report {

std::string escape_html(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string palette_color(size_t index) {
  // Colour-blind-safe (Okabe-Ito), then darker repeats.
  static const char* kPalette[] = {"#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7",
                                   "#56B4E9", "#F0E442", "#000000", "#7F7F7F", "#8C564B"};
  return kPalette[index % (sizeof(kPalette) / sizeof(kPalette[0]))];
}

std::vector<double> nice_ticks(double lo, double hi, int count, double min_step) {
  // A range within a billionth of its values (two readings a rounding apart) is drawn
  // as flat, and no step is finer than that: a step under half an ulp of the values
  // would not advance t below (a run's report looped pushing ticks until bad_alloc).
  const double scale = std::max(std::abs(lo), std::abs(hi));
  if (!(hi - lo > 1e-9 * scale)) hi = lo + std::max(1.0, 0.1 * scale);
  const double raw = std::max({(hi - lo) / std::max(1, count), min_step, 1e-9 * scale});
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * magnitude >= raw) {
      step = m * magnitude;
      break;
    }
  // From the last round value at or below lo to the first at or above hi.
  std::vector<double> ticks;
  for (double t = std::floor(lo / step + 1e-9) * step;; t += step) {
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
    if (t >= hi - step * 1e-9) break;
  }
  return ticks;
}

std::string format_tick(double v) {
  const double a = std::abs(v);
  if (a >= 1e9) return fmt::format("{:.3g}G", v / 1e9);
  if (a >= 1e6) return fmt::format("{:.3g}M", v / 1e6);
  if (a >= 1e4) return fmt::format("{:.3g}k", v / 1e3);
  return fmt::format("{:.4g}", v);
}

namespace {

struct Frame {
  double left = 64, right = 16, top = 36, bottom = 46;
  int width, height;
  double x0, x1, y0, y1;
  double px(double x) const { return left + (x - x0) / (x1 - x0) * (width - left - right); }
  double py(double y) const { return height - bottom - (y - y0) / (y1 - y0) * (height - top - bottom); }
};

std::string open_svg(int width, int height, const std::string& title) {
  return fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "font-family=\"sans-serif\" font-size=\"11\" role=\"img\"><title>{}</title>"
      "<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>"
      "<text x=\"{}\" y=\"18\" text-anchor=\"middle\" font-size=\"13\" font-weight=\"bold\">{}</text>",
      width, height, width, height, escape_html(title), width / 2, escape_html(title));
}

// Axes with ticks, grid lines and labels.
std::string axes(const Frame& f, const std::vector<double>& xticks, const std::vector<double>& yticks,
                 const std::string& x_label, const std::string& y_label) {
  std::string s;
  for (double y : yticks)
    s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>"
                     "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>",
                     f.left, f.py(y), f.width - f.right, f.py(y), f.left - 4, f.py(y) + 4,
                     escape_html(format_tick(y)));
  for (double x : xticks)
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>", f.px(x),
                     f.height - f.bottom + 14, escape_html(format_tick(x)));
  s += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#333\"/>"
                   "<line x1=\"{0:.1f}\" y1=\"{2:.1f}\" x2=\"{3:.1f}\" y2=\"{2:.1f}\" stroke=\"#333\"/>",
                   f.left, f.top, f.height - f.bottom, f.width - f.right);
  if (!x_label.empty())
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>",
                     (f.left + f.width - f.right) / 2, f.height - f.bottom + 28, escape_html(x_label));
  if (!y_label.empty())
    s += fmt::format("<text transform=\"translate(14,{:.1f}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
                     (f.top + f.height - f.bottom) / 2, escape_html(y_label));
  return s;
}

std::string legend(const std::vector<std::string>& names, const std::vector<std::string>& colors,
                   double x, double y, double max_width) {
  std::string s;
  double cx = x, cy = y;
  for (size_t i = 0; i < names.size(); ++i) {
    const double w = 24 + 7 * static_cast<double>(names[i].size());
    if (cx + w > x + max_width && cx > x) cx = x, cy += 14;
    s += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"10\" height=\"10\" fill=\"{}\"/>"
                     "<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>",
                     cx, cy - 9, colors[i], cx + 13, cy, escape_html(names[i]));
    cx += w;
  }
  return s;
}

}  // namespace

std::string line_chart_svg(const LineChart& c) {
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const auto& s : c.series)
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
      if (std::isfinite(s.x[i]) && std::isfinite(s.y[i])) {
        x0 = std::min(x0, s.x[i]), x1 = std::max(x1, s.x[i]);
        y0 = std::min(y0, s.y[i]), y1 = std::max(y1, s.y[i]);
      }
  if (!std::isfinite(x0))
    return open_svg(c.width, c.height, c.title) +
           "<text x=\"50%\" y=\"50%\" text-anchor=\"middle\">no data</text></svg>";
  if (x1 == x0) x0 -= 1, x1 += 1;
  const double pad = (y1 - y0) * 0.05 + (y1 == y0 ? std::max(1.0, std::abs(y1) * 0.1) : 0);
  // Non-negative data keeps a non-negative axis.
  y0 = y0 >= 0 ? std::max(0.0, y0 - pad) : y0 - pad;
  y1 += pad;
  const auto yt = nice_ticks(y0, y1, 5);
  // Steps are whole numbers: no tick at step 1.5.
  bool whole_x = true;
  for (const auto& s : c.series)
    for (double x : s.x) whole_x = whole_x && (!std::isfinite(x) || x == std::floor(x));
  const auto xt = whole_x ? nice_ticks(x0, x1, 6, 1.0) : nice_ticks(x0, x1, 6);
  // A lone series named like the chart needs no legend.
  const bool with_legend = !(c.series.size() == 1 && c.series[0].name == c.title);
  const int legend_rows = with_legend ? static_cast<int>((c.series.size() + 3) / 4) : 0;
  Frame f;
  f.width = c.width, f.height = c.height + 14 * legend_rows;
  if (legend_rows > 0) f.bottom = 50 + 14.0 * legend_rows;  // ticks, x label, then the legend
  f.x0 = x0, f.x1 = x1, f.y0 = std::min(y0, yt.front()), f.y1 = std::max(y1, yt.back());
  std::string svg = open_svg(f.width, f.height, c.title) + axes(f, xt, yt, c.x_label, c.y_label);
  std::vector<std::string> names, colors;
  for (size_t k = 0; k < c.series.size(); ++k) {
    const Series& s = c.series[k];
    const std::string color = s.color.empty() ? palette_color(k) : s.color;
    std::string points;
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      if (s.points_only || s.x.size() == 1)
        svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\"/>", f.px(s.x[i]),
                           f.py(s.y[i]), color);
      else
        points += fmt::format("{:.1f},{:.1f} ", f.px(s.x[i]), f.py(s.y[i]));
    }
    if (!points.empty())
      svg += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.8\" points=\"{}\"/>",
                         color, points);
    names.push_back(s.name);
    colors.push_back(color);
  }
  if (with_legend)
    svg += legend(names, colors, f.left, f.height - 8 - 14.0 * (legend_rows - 1),
                  f.width - f.left - f.right);
  return svg + "</svg>";
}

std::string stacked_bars_svg(const StackedBars& c) {
  const size_t B = c.bars.size(), C = c.categories.size();
  double top = 0;
  for (size_t b = 0; b < B; ++b) {
    double sum = 0;
    for (size_t k = 0; k < C; ++k) sum += std::max(0.0, c.values[k][b]);
    top = std::max(top, sum);
  }
  const auto yt = nice_ticks(0, top > 0 ? top * 1.05 : 1, 5);
  const int legend_rows = static_cast<int>((C + 3) / 4);
  Frame f;
  f.width = c.width;
  f.height = c.height + 14 * legend_rows;
  f.bottom = 62 + 14.0 * legend_rows;
  f.x0 = 0, f.x1 = static_cast<double>(std::max<size_t>(B, 1));
  f.y0 = 0, f.y1 = yt.back();
  std::string svg = open_svg(f.width, f.height, c.title) + axes(f, {}, yt, "", c.y_label);
  const double slot = (f.width - f.left - f.right) / static_cast<double>(std::max<size_t>(B, 1));
  const double bar = std::min(56.0, slot * 0.7);
  for (size_t b = 0; b < B; ++b) {
    const double cx = f.left + slot * (static_cast<double>(b) + 0.5);
    double base = 0;
    for (size_t k = 0; k < C; ++k) {
      const double v = std::max(0.0, c.values[k][b]);
      if (v <= 0) continue;
      const std::string color = k < c.colors.size() && !c.colors[k].empty() ? c.colors[k] : palette_color(k);
      svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\">"
                         "<title>{}: {}</title></rect>",
                         cx - bar / 2, f.py(base + v), bar, f.py(base) - f.py(base + v), color,
                         escape_html(c.bars[b] + " " + c.categories[k]), escape_html(format_tick(v)));
      base += v;
    }
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>", cx,
                       f.py(base) - 3, escape_html(format_tick(base)));
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\" transform=\"rotate(-25 {:.1f} {:.1f})\">{}</text>",
                       cx + 4, f.height - f.bottom + 14, cx + 4, f.height - f.bottom + 14,
                       escape_html(c.bars[b]));
  }
  std::vector<std::string> colors;
  for (size_t k = 0; k < C; ++k)
    colors.push_back(k < c.colors.size() && !c.colors[k].empty() ? c.colors[k] : palette_color(k));
  svg += legend(c.categories, colors, f.left, f.height - 8 - 14.0 * (legend_rows - 1),
                f.width - f.left - f.right);
  return svg + "</svg>";
}

std::string sparkline_svg(const std::string& title, const std::vector<double>& x,
                          const std::vector<double>& y) {
  LineChart c;
  c.title = title;
  c.width = 300;
  c.height = 150;
  Series s;
  s.name = title;
  s.x = x;
  s.y = y;
  s.points_only = std::count_if(y.begin(), y.end(), [](double v) { return std::isfinite(v); }) < 2;
  c.series.push_back(std::move(s));
  return line_chart_svg(c);
}

}  // namespace shardlm::report
