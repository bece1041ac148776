// The --plot chart renders in a real browser: headless Chromium takes a screenshot of it, and
// the screenshot must not be blank. Skips where Chromium is not installed.
#include "svg.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "support/status_matchers.hpp"

namespace pagedkv::sim {
namespace {

// The first of the usual Chromium binaries found on PATH, or "".
std::string find_chromium() {
  for (const char* name : {"chromium", "chromium-browser", "google-chrome", "chrome"}) {
    const std::string cmd = std::string("command -v ") + name + " >/dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) return name;
  }
  return "";
}

long file_size(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  return f ? static_cast<long>(f.tellg()) : -1;
}

// Screenshots `svg_path` into `png_path`; true when Chromium wrote a PNG.
bool screenshot(const std::string& chromium, const std::string& svg_path,
                const std::string& png_path) {
  std::remove(png_path.c_str());
  const std::string cmd = chromium +
                          " --headless --no-sandbox --disable-gpu --hide-scrollbars "
                          "--window-size=960,440 --screenshot=" +
                          png_path + " file://" + svg_path + " >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0 && file_size(png_path) > 0;
}

SimResult synthetic_run() {
  SimResult r;
  for (int64_t i = 0; i < 300; ++i) {
    StepRecord t;
    t.step = i;
    t.device_used = 50 + (i * 7) % 150;
    t.device_cached = 20 + i % 30;
    t.host_used = i < 150 ? i : 300 - i;
    t.hit_rate = static_cast<double>(i) / 400.0;
    r.timeline.push_back(t);
  }
  r.steps = 300;
  return r;
}

TEST(Svg, ChartIsAStandaloneDocumentWithEverySeries) {
  CacheConfig c;
  c.num_device_blocks = 256;
  c.num_host_blocks = 512;
  const std::string svg = render_svg(c, synthetic_run(), "a <test> & chart");
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("a &lt;test&gt; &amp; chart"), std::string::npos);
  size_t lines = 0;
  for (size_t p = svg.find("<polyline"); p != std::string::npos; p = svg.find("<polyline", p + 1))
    ++lines;
  EXPECT_EQ(lines, 4u);  // device referenced + cached, device referenced, host, hit rate
}

TEST(Svg, RendersInHeadlessChromium) {
  const std::string chromium = find_chromium();
  if (chromium.empty()) GTEST_SKIP() << "chromium is not installed (apt-get install chromium)";
  CacheConfig c;
  c.num_device_blocks = 256;
  c.num_host_blocks = 512;
  const std::string dir = ::testing::TempDir();
  const std::string chart = dir + "pagedkv_sim_chart.svg", blank = dir + "pagedkv_sim_blank.svg";
  ASSERT_OK(write_svg(chart, c, synthetic_run(), "pagedkv-sim test chart"));
  {
    // The baseline: an empty white page of the same size, rendered the same way.
    std::ofstream f(blank);
    f << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"960\" height=\"440\"><rect "
         "width=\"100%\" height=\"100%\" fill=\"white\"/></svg>\n";
  }
  const std::string chart_png = chart + ".png", blank_png = blank + ".png";
  if (!screenshot(chromium, blank, blank_png))
    GTEST_SKIP() << chromium << " is installed but could not take a screenshot here";
  ASSERT_TRUE(screenshot(chromium, chart, chart_png));
  // A PNG of one flat colour compresses to almost nothing; lines, text and axes do not. Without
  // a PNG decoder in the build, the size against the blank baseline is the "not blank" check.
  const long chart_bytes = file_size(chart_png), blank_bytes = file_size(blank_png);
  EXPECT_GT(chart_bytes, 3 * blank_bytes)
      << "chart " << chart_bytes << " B, blank " << blank_bytes << " B";
  std::ifstream png(chart_png, std::ios::binary);
  char magic[8] = {};
  png.read(magic, 8);
  EXPECT_EQ(std::string(magic + 1, 3), "PNG");
}

}  // namespace
}  // namespace pagedkv::sim
