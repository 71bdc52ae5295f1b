// The SVG line chart of `heavykv eval --plot` (server/cli/svg_plot.h): ticks, the points drawn
// where their values say, escaping, and the eval command writing one chart per run.
#include "server/cli/svg_plot.h"

#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/test_util.h"

namespace heavykv::cli {
namespace {

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The (x, y) pixel pairs of every polyline, in order.
std::vector<std::vector<std::pair<double, double>>> Polylines(const std::string& svg) {
  std::vector<std::vector<std::pair<double, double>>> out;
  const std::regex line("<polyline[^>]* points=\"([^\"]*)\"");
  const std::regex pair("([-0-9.]+),([-0-9.]+)");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), line); it != std::sregex_iterator();
       ++it) {
    const std::string points = (*it)[1];
    auto& pts = out.emplace_back();
    for (auto p = std::sregex_iterator(points.begin(), points.end(), pair);
         p != std::sregex_iterator(); ++p) {
      pts.push_back({std::stod((*p)[1]), std::stod((*p)[2])});
    }
  }
  return out;
}

TEST(SvgPlotTest, NiceTicksCoverTheRangeInRoundSteps) {
  EXPECT_EQ(NiceTicks(0, 10, 5), (std::vector<double>{0, 2, 4, 6, 8, 10}));
  EXPECT_EQ(NiceTicks(51, 410, 6), (std::vector<double>{0, 100, 200, 300, 400, 500}));
  EXPECT_EQ(NiceTicks(3.2, 3.9, 4), (std::vector<double>{3.2, 3.4, 3.6, 3.8, 4.0}));
  const std::vector<double> flat = NiceTicks(7, 7, 5);  // one value: a range around it
  EXPECT_LT(flat.front(), 7);
  EXPECT_GT(flat.back(), 7);
}

TEST(SvgPlotTest, PointsLandWhereTheirValuesSay) {
  const std::vector<PlotSeries> series = {
      {"h2o", {{100, 6.0}, {50, 8.0}, {200, 5.0}}},           // drawn in x order
      {"win<dow> & co", {{50, 12.0}, {100, 9.0}, {200, NAN}}},  // NaN left out
      {"full", {{50, 4.0}, {200, 4.0}}, true},
  };
  PlotOptions o{"Perplexity \"test\"", "budget", "ppl"};
  const std::string svg = LinePlotSvg(series, o);
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_EQ(Count(svg, "<g"), Count(svg, "</g>"));
  EXPECT_EQ(Count(svg, "class=\"series\""), 3);
  EXPECT_NE(svg.find("win&lt;dow&gt; &amp; co"), std::string::npos);
  EXPECT_EQ(svg.find("win<dow>"), std::string::npos);
  EXPECT_NE(svg.find("Perplexity &quot;test&quot;"), std::string::npos);
  EXPECT_NE(svg.find("stroke-dasharray"), std::string::npos);  // the reference line
  EXPECT_EQ(Count(svg, "<circle"), 3 + 2);                        // markers, none for "full"

  const auto lines = Polylines(svg);
  ASSERT_EQ(lines.size(), 3u);
  ASSERT_EQ(lines[0].size(), 3u);
  ASSERT_EQ(lines[1].size(), 2u);
  // x increases along each line; a larger value is higher (a smaller pixel y).
  EXPECT_LT(lines[0][0].first, lines[0][1].first);
  EXPECT_LT(lines[0][1].first, lines[0][2].first);
  EXPECT_GT(lines[0][2].second, lines[0][1].second);  // ppl 5 below ppl 6
  EXPECT_LT(lines[0][0].second, lines[0][1].second);  // ppl 8 at x 50 above ppl 6 at x 100
  EXPECT_LT(lines[1][0].second, lines[0][0].second);  // 12 above 8
  // Equal values at equal heights; linear axis: 6 is halfway between 4 and 8.
  EXPECT_DOUBLE_EQ(lines[2][0].second, lines[2][1].second);
  const double y4 = lines[2][0].second, y8 = lines[0][0].second, y6 = lines[0][1].second;
  EXPECT_NEAR(y6, (y4 + y8) / 2, 0.02);
  // The same x at the same pixel in every series.
  EXPECT_DOUBLE_EQ(lines[0][0].first, lines[1][0].first);
  EXPECT_EQ(LinePlotSvg(series, o), svg);  // deterministic

  // Log axis: 10 is halfway between 1 and 100.
  o.log_y = true;
  const auto log_lines = Polylines(LinePlotSvg({{"a", {{1, 1.0}, {2, 10.0}, {3, 100.0}}}}, o));
  ASSERT_EQ(log_lines.size(), 1u);
  EXPECT_NEAR(log_lines[0][1].second, (log_lines[0][0].second + log_lines[0][2].second) / 2, 0.02);
}

// y_clip: the axis ends at the first tick at or above it; a point above is drawn on the top
// edge as a labelled triangle, its line goes to the edge, and the other points keep their scale.
TEST(SvgPlotTest, ClippedAxisLabelsTheOutliers) {
  const std::vector<PlotSeries> series = {
      {"h2o", {{50, 3.1}, {100, 2.9}, {200, 2.87}}},
      {"knorm", {{50, 8.12}, {100, 7.5}, {200, 3.0}}},
      {"full", {{50, 2.866}, {200, 2.866}}, true},
  };
  PlotOptions o{"t", "budget", "ppl"};
  const std::string unclipped = LinePlotSvg(series, o);
  EXPECT_EQ(Count(unclipped, "class=\"clipped\""), 0);
  EXPECT_NE(unclipped.find(">8</text>"), std::string::npos);  // the axis reaches knorm's 8.12
  o.y_clip = 1.5 * 2.866;  // 4.3: ticks 2.5 .. 4.5 in steps of 0.5
  const std::string svg = LinePlotSvg(series, o);
  EXPECT_EQ(Count(svg, "<g"), Count(svg, "</g>"));
  EXPECT_EQ(Count(svg, "class=\"clipped\""), 2);  // knorm at 50 and 100
  EXPECT_NE(svg.find(">8.12</text>"), std::string::npos);
  EXPECT_NE(svg.find(">7.5</text>"), std::string::npos);
  EXPECT_NE(svg.find(">4.5</text>"), std::string::npos);  // the top tick
  EXPECT_EQ(svg.find(">5</text>"), std::string::npos);
  EXPECT_NE(svg.find("above 4.5: its value"), std::string::npos);
  EXPECT_EQ(Count(svg, "<circle"), 3 + 1);  // h2o's 3, knorm's unclipped 3.0
  const auto lines = Polylines(svg);
  ASSERT_EQ(lines.size(), 3u);
  // knorm's clipped points sit on the top edge (the same pixel y); its 3.0 lies between h2o's
  // 2.9 and 3.1 as on an unclipped axis.
  EXPECT_DOUBLE_EQ(lines[1][0].second, lines[1][1].second);
  EXPECT_LT(lines[1][0].second, lines[0][0].second);
  EXPECT_GT(lines[1][2].second, lines[0][0].second);
  EXPECT_LT(lines[1][2].second, lines[0][1].second);
  // The unclipped lines spread over more of the plot than on the unclipped axis.
  const auto wide = Polylines(unclipped);
  EXPECT_GT(lines[0][2].second - lines[0][0].second,
            3 * (wide[0][2].second - wide[0][0].second));
  // Nothing above y_clip: nothing clipped, no note.
  o.y_clip = 10;
  EXPECT_EQ(Count(LinePlotSvg(series, o), "class=\"clipped\""), 0);
  EXPECT_EQ(LinePlotSvg(series, o).find("its value"), std::string::npos);
}

TEST(SvgPlotTest, NoDataIsStillAChart) {
  const std::string svg = LinePlotSvg({{"a", {{NAN, 1.0}}}}, {"t", "x", "y"});
  EXPECT_NE(svg.find("no data"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
}

// `heavykv eval --plot`: one line per policy with a point per budget, and the full cache dashed.
TEST(SvgPlotTest, EvalWritesThePlot) {
  testing::TempDir dir;
  const std::string plot = dir.File("ppl.svg");
  const std::string cmd = std::string(HEAVYKV_BINARY) + " eval --model " +
                          testing::ModelPath() + " --tokenizer " + testing::TokenizerPath() +
                          " --text " + testing::SourcePath("tests/data/eval_stories.txt") +
                          " --window 128 --max-windows 2 --policy full,window,h2o --kv-budget "
                          "32,64,0.75 --threads 1 --plot " + plot + " 2>&1";
  const std::string output = testing::RunCapture(cmd);
  std::ifstream in(plot);
  ASSERT_TRUE(in.good()) << output;
  std::stringstream svg;
  svg << in.rdbuf();
  const std::string text = svg.str();
  EXPECT_NE(text.find("data-name=\"window\""), std::string::npos);
  EXPECT_NE(text.find("data-name=\"h2o\""), std::string::npos);
  EXPECT_NE(text.find("data-name=\"full\""), std::string::npos);
  const auto lines = Polylines(text);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].size(), 3u);
  EXPECT_EQ(lines[1].size(), 3u);
  EXPECT_EQ(lines[2].size(), 2u);
  // An unwritable path is an error, not a silent success.
  int code = 0;
  const std::string bad = testing::RunCapture(
      std::string(HEAVYKV_BINARY) + " eval --model " + testing::ModelPath() + " --tokenizer " +
      testing::TokenizerPath() + " --text " + testing::SourcePath("tests/data/eval_stories.txt") +
      " --window 64 --max-windows 1 --policy full --plot " + dir.File("no/such/dir/p.svg") +
      " 2>&1", &code);
  EXPECT_NE(code, 0) << bad;
  EXPECT_NE(bad.find("--plot"), std::string::npos) << bad;
}

// The precision axis (issue 29): --kv-dtype fp32,int8,int4 evaluates every configuration over
// each K/V type: a line per (policy, type) and a dashed full line per type; the JSON rows name
// their type. A list is refused where only one type can run (passkey).
TEST(SvgPlotTest, EvalPlotsThePrecisionAxis) {
  testing::TempDir dir;
  const std::string plot = dir.File("ppl.svg");
  const std::string base = std::string(HEAVYKV_BINARY) + " eval --model " +
                           testing::ModelPath() + " --tokenizer " + testing::TokenizerPath() +
                           " --text " + testing::SourcePath("tests/data/eval_stories.txt") +
                           " --window 128 --max-windows 2 --threads 1";
  const std::string output = testing::RunCapture(
      base + " --policy full,h2o --kv-budget 32,64 --kv-dtype fp32,int8,int4 --json --plot " +
      plot + " 2>/dev/null");
  std::ifstream in(plot);
  ASSERT_TRUE(in.good()) << output;
  std::stringstream svg;
  svg << in.rdbuf();
  const std::string text = svg.str();
  for (const char* name : {"h2o fp32", "h2o int8", "h2o int4", "full fp32", "full int8",
                           "full int4"}) {
    EXPECT_NE(text.find(absl::StrCat("data-name=\"", name, "\"")), std::string::npos) << name;
  }
  EXPECT_EQ(Polylines(text).size(), 6u);
  for (const char* type : {"fp32", "int8", "int4"}) {
    EXPECT_NE(output.find(absl::StrCat("\"kv_dtype\":\"", type, "\"")), std::string::npos)
        << output;
  }
  int code = 0;
  const std::string bad = testing::RunCapture(
      std::string(HEAVYKV_BINARY) + " eval --task passkey --model " + testing::ModelPath() +
          " --tokenizer " + testing::TokenizerPath() + " --kv-dtype fp32,int8 2>&1",
      &code);
  EXPECT_NE(code, 0) << bad;
  EXPECT_NE(bad.find("a list of --kv-dtype"), std::string::npos) << bad;
}

}  // namespace
}  // namespace heavykv::cli
