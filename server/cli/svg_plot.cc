#include "server/cli/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace heavykv::cli {
namespace {

// Distinguishable on white and in grey print (the Tableau 10 hues).
constexpr const char* kColors[] = {"#4e79a7", "#e15759", "#59a14f", "#f28e2b", "#b07aa1",
                                   "#76b7b2", "#edc948", "#ff9da7", "#9c755f", "#bab0ac"};

std::string Escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        // XML 1.0 forbids most control characters even escaped.
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t' || c == '\n') out += c;
    }
  }
  return out;
}

// A tick label: the shortest of %g forms that reads back as the value to 4 significant digits.
std::string Label(double v) {
  if (std::abs(v) < 1e-12) return "0";
  return absl::StrFormat("%.4g", v);
}

std::string Num(double v) { return absl::StrFormat("%.2f", v); }

// Ticks of a log axis over [lo, hi] (both > 0): 1, 2, 5 x 10^k when the range spans at most
// two decades, else the decades alone.
std::vector<double> LogTicks(double lo, double hi) {
  std::vector<double> out;
  const int first = static_cast<int>(std::floor(std::log10(lo)));
  const int last = static_cast<int>(std::ceil(std::log10(hi)));
  const bool fine = last - first <= 2;
  for (int e = first; e <= last; ++e) {
    for (double m : {1.0, 2.0, 5.0}) {
      if (!fine && m != 1.0) continue;
      const double v = m * std::pow(10.0, e);
      if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) out.push_back(v);
    }
  }
  return out;
}

// The largest 1, 2 or 5 x 10^k at most v (> 0), and the smallest at least v.
double NiceBelow(double v) {
  const double decade = std::pow(10.0, std::floor(std::log10(v)));
  double best = decade;
  for (double m : {2.0, 5.0}) {
    if (m * decade <= v * (1 + 1e-9)) best = m * decade;
  }
  return best;
}
double NiceAbove(double v) {
  const double decade = std::pow(10.0, std::floor(std::log10(v)));
  for (double m : {1.0, 2.0, 5.0}) {
    if (m * decade >= v * (1 - 1e-9)) return m * decade;
  }
  return 10 * decade;
}

}  // namespace

std::vector<double> NiceTicks(double lo, double hi, int target) {
  if (!(hi > lo)) {
    const double pad = lo == 0 ? 1 : std::abs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / std::max(1, target);
  const int e = static_cast<int>(std::floor(std::log10(raw)));
  const double mag = std::pow(10.0, e);
  double m = 1;
  for (double c : {1.0, 2.0, 5.0, 10.0}) {
    m = c;
    if (c * mag >= raw) break;
  }
  // Tick k is k * m * 10^e, computed as (k * m) / 10^-e for e < 0 so that 0.2 steps give 3.2,
  // 3.4, ... exactly as written.
  const double scale = std::pow(10.0, std::abs(e));
  const auto tick = [&](double k) { return e < 0 ? k * m / scale : k * m * scale; };
  const double step = m * mag;
  std::vector<double> out;
  const double first = std::floor(lo / step + 1e-9);
  for (int i = 0; i < 1000; ++i) {
    const double v = tick(first + i);
    out.push_back(v == 0 ? 0.0 : v);
    if (v >= hi - step * 1e-9) break;
  }
  return out;
}

std::string LinePlotSvg(const std::vector<PlotSeries>& series, const PlotOptions& o) {
  const double left = 72, right = 170, top = 44, bottom = 56;
  const double w = std::max(200, o.width), h = std::max(160, o.height);
  const double pw = w - left - right, ph = h - top - bottom;

  // The points that can be drawn, per series, in x order.
  std::vector<std::vector<std::pair<double, double>>> drawn(series.size());
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo;
  double y_lo = x_lo, y_hi = -x_lo;
  for (size_t s = 0; s < series.size(); ++s) {
    for (const auto& [x, y] : series[s].points) {
      if (!std::isfinite(x) || !std::isfinite(y) || (o.log_y && y <= 0)) continue;
      drawn[s].push_back({x, y});
      x_lo = std::min(x_lo, x);
      x_hi = std::max(x_hi, x);
      // A clipped axis spans the values up to y_clip; the points above it are drawn on its edge.
      const double y_in = o.y_clip > 0 ? std::min(y, o.y_clip) : y;
      y_lo = std::min(y_lo, y_in);
      y_hi = std::max(y_hi, y_in);
    }
    std::stable_sort(drawn[s].begin(), drawn[s].end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
  }
  const bool empty = !std::isfinite(x_lo);
  if (empty) x_lo = 0, x_hi = 1, y_lo = 1, y_hi = 10;

  const std::vector<double> xt = NiceTicks(x_lo, x_hi, 6);
  std::vector<double> yt;
  double ymin, ymax;
  if (o.log_y) {
    ymin = NiceBelow(y_lo);
    ymax = NiceAbove(y_hi);
    if (ymax <= ymin) ymax = NiceAbove(ymin * 1.01);
    yt = LogTicks(ymin, ymax);
  } else {
    yt = NiceTicks(y_lo, y_hi, 6);
    ymin = yt.front();
    ymax = yt.back();
  }
  const double xmin = xt.front(), xmax = xt.back();
  const auto px = [&](double x) { return left + (x - xmin) / (xmax - xmin) * pw; };
  const bool clips = o.y_clip > 0;
  // Above the axis: drawn on its top edge (a clipped axis only; otherwise nothing is above).
  const auto above = [&](double y) { return clips && y > ymax * (1 + 1e-9); };
  const auto py = [&](double y_value) {
    const double y = above(y_value) ? ymax : y_value;
    const double f = o.log_y ? (std::log10(y) - std::log10(ymin)) /
                                   (std::log10(ymax) - std::log10(ymin))
                             : (y - ymin) / (ymax - ymin);
    return top + (1 - f) * ph;
  };

  std::string out = absl::StrCat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n",
      "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"", w, "\" height=\"", h,
      "\" viewBox=\"0 0 ", w, " ", h, "\" font-family=\"sans-serif\" font-size=\"12\">\n",
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n");
  absl::StrAppend(&out, "<text x=\"", Num(left + pw / 2), "\" y=\"24\" text-anchor=\"middle\" ",
                  "font-size=\"15\">", Escape(o.title), "</text>\n");
  // Grid and ticks.
  absl::StrAppend(&out, "<g stroke=\"#e0e0e0\" stroke-width=\"1\">\n");
  for (double x : xt) {
    absl::StrAppend(&out, "<line x1=\"", Num(px(x)), "\" y1=\"", Num(top), "\" x2=\"",
                    Num(px(x)), "\" y2=\"", Num(top + ph), "\"/>\n");
  }
  for (double y : yt) {
    absl::StrAppend(&out, "<line x1=\"", Num(left), "\" y1=\"", Num(py(y)), "\" x2=\"",
                    Num(left + pw), "\" y2=\"", Num(py(y)), "\"/>\n");
  }
  absl::StrAppend(&out, "</g>\n<g fill=\"#333\">\n");
  for (double x : xt) {
    absl::StrAppend(&out, "<text x=\"", Num(px(x)), "\" y=\"", Num(top + ph + 18),
                    "\" text-anchor=\"middle\">", Label(x), "</text>\n");
  }
  for (double y : yt) {
    absl::StrAppend(&out, "<text x=\"", Num(left - 8), "\" y=\"", Num(py(y) + 4),
                    "\" text-anchor=\"end\">", Label(y), "</text>\n");
  }
  absl::StrAppend(&out, "<text x=\"", Num(left + pw / 2), "\" y=\"", Num(h - 14),
                  "\" text-anchor=\"middle\">", Escape(o.x_label), "</text>\n");
  absl::StrAppend(&out, "<text transform=\"translate(18 ", Num(top + ph / 2),
                  ") rotate(-90)\" text-anchor=\"middle\">", Escape(o.y_label), "</text>\n");
  absl::StrAppend(&out, "</g>\n<rect x=\"", Num(left), "\" y=\"", Num(top), "\" width=\"",
                  Num(pw), "\" height=\"", Num(ph),
                  "\" fill=\"none\" stroke=\"#333\" stroke-width=\"1\"/>\n");
  if (empty) {
    absl::StrAppend(&out, "<text x=\"", Num(left + pw / 2), "\" y=\"", Num(top + ph / 2),
                    "\" text-anchor=\"middle\" fill=\"#999\">no data</text>\n");
  }

  // Series, then the legend (one row per series, in order).
  std::map<double, int> clipped_at;  // clipped points drawn so far per x
  bool any_clipped = false;
  for (const auto& points : drawn) {
    for (const auto& [x, y] : points) any_clipped = any_clipped || above(y);
  }
  for (size_t s = 0; s < series.size(); ++s) {
    const char* color = kColors[s % std::size(kColors)];
    const std::string dash = series[s].dashed ? " stroke-dasharray=\"6 4\"" : "";
    absl::StrAppend(&out, "<g class=\"series\" data-name=\"", Escape(series[s].name), "\">\n");
    if (drawn[s].size() >= 2) {
      absl::StrAppend(&out, "<polyline fill=\"none\" stroke=\"", color, "\" stroke-width=\"2\"",
                      dash, " points=\"");
      for (size_t i = 0; i < drawn[s].size(); ++i) {
        absl::StrAppend(&out, i ? " " : "", Num(px(drawn[s][i].first)), ",",
                        Num(py(drawn[s][i].second)));
      }
      absl::StrAppend(&out, "\"/>\n");
    }
    for (const auto& [x, y] : drawn[s]) {
      if (above(y)) {
        // An open triangle on the top edge, pointing up, and the value below it; labels of
        // clipped points at the same x stack downwards.
        const double cx = px(x), cy = py(y);
        const int row = clipped_at[x]++;
        absl::StrAppend(&out, "<polygon class=\"clipped\" points=\"", Num(cx - 5), ",",
                        Num(cy + 4), " ", Num(cx + 5), ",", Num(cy + 4), " ", Num(cx), ",",
                        Num(cy - 5), "\" fill=\"white\" stroke=\"", color,
                        "\" stroke-width=\"2\"/>\n");
        absl::StrAppend(&out, "<text x=\"", Num(cx + 8), "\" y=\"", Num(cy + 16 + 13 * row),
                        "\" fill=\"", color, "\" font-size=\"11\">", Label(y), "</text>\n");
      } else if (!series[s].dashed) {
        absl::StrAppend(&out, "<circle cx=\"", Num(px(x)), "\" cy=\"", Num(py(y)),
                        "\" r=\"3.5\" fill=\"", color, "\"/>\n");
      }
    }
    const double ly = top + 10 + 20 * static_cast<double>(s);
    absl::StrAppend(&out, "<line x1=\"", Num(left + pw + 14), "\" y1=\"", Num(ly), "\" x2=\"",
                    Num(left + pw + 40), "\" y2=\"", Num(ly), "\" stroke=\"", color,
                    "\" stroke-width=\"2\"", dash, "/>\n");
    absl::StrAppend(&out, "<text x=\"", Num(left + pw + 46), "\" y=\"", Num(ly + 4), "\">",
                    Escape(series[s].name), "</text>\n</g>\n");
  }
  if (any_clipped) {
    const double ly = top + 10 + 20 * static_cast<double>(series.size()) + 6;
    absl::StrAppend(&out, "<text x=\"", Num(left + pw + 14), "\" y=\"", Num(ly + 4),
                    "\" font-size=\"11\" fill=\"#333\">&#9651; above ", Label(ymax),
                    ": its value</text>\n");
  }
  absl::StrAppend(&out, "</svg>\n");
  return out;
}

}  // namespace heavykv::cli
