// A small line-chart writer for `heavykv eval --plot`: series of (x, y) points drawn as an SVG
// file with axes, ticks, markers and a legend. No I/O; the caller writes the string.
//
//   std::vector<PlotSeries> series = {{"h2o", {{51, 9.2}, {102, 7.1}}}, {"full", {...}, true}};
//   std::string svg = LinePlotSvg(series, {"Perplexity against KV budget", "budget", "ppl"});
//
// Points with a non-finite coordinate (or y <= 0 on a log axis) are left out. With `y_clip`, the
// y axis ends at the first tick at or above it, and a point above the axis is drawn on its top
// edge as an open triangle labelled with its value (an outlier keeps the others readable). Text
// is XML-escaped. The output is a standalone SVG 1.1 document, the same bytes for the same input.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace heavykv::cli {

struct PlotSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;  // drawn in x order
  bool dashed = false;                            // a reference line (e.g. the full cache)
};

struct PlotOptions {
  std::string title, x_label, y_label;
  bool log_y = false;  // a logarithmic y axis (decades, with 2 and 5 between when they fit)
  // > 0: the y axis covers at most up to the first tick >= y_clip; points above it are clipped
  // (drawn on the top edge, labelled with their value). 0: the axis covers every point.
  double y_clip = 0;
  int width = 760, height = 460;
};

std::string LinePlotSvg(const std::vector<PlotSeries>& series, const PlotOptions& options);

// Ticks for [lo, hi] on a linear axis: multiples of 1, 2 or 5 x 10^k, about `target` of them,
// covering the range (the first <= lo, the last >= hi).
std::vector<double> NiceTicks(double lo, double hi, int target);

}  // namespace heavykv::cli
