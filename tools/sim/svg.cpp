#include "svg.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace pagedkv {
namespace sim {

namespace {

constexpr double kWidth = 960, kHeight = 440;
constexpr double kLeft = 70, kRight = 70, kTop = 40, kBottom = 50;
constexpr size_t kMaxPoints = 1200;  // keeps the file small for long runs

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

std::string escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    if (ch == '<')
      o += "&lt;";
    else if (ch == '>')
      o += "&gt;";
    else if (ch == '&')
      o += "&amp;";
    else
      o += ch;
  }
  return o;
}

}  // namespace

std::string render_svg(const CacheConfig& cache, const SimResult& r, const std::string& title) {
  const double pw = kWidth - kLeft - kRight, ph = kHeight - kTop - kBottom;
  const double ymax = static_cast<double>(
      std::max<int64_t>(1, std::max(cache.num_device_blocks, cache.num_host_blocks)));
  const size_t n = r.timeline.size();
  const double xmax = static_cast<double>(std::max<size_t>(n, 2) - 1);
  const size_t stride = std::max<size_t>(1, n / kMaxPoints);
  auto x = [&](size_t i) { return kLeft + pw * static_cast<double>(i) / xmax; };
  auto y = [&](double v) { return kTop + ph * (1.0 - v / ymax); };
  auto y_rate = [&](double v) { return kTop + ph * (1.0 - v); };
  auto line = [&](auto value, auto to_y) {
    std::string pts;
    for (size_t i = 0; i < n; i += stride)
      pts += num(x(i)) + "," + num(to_y(value(r.timeline[i]))) + " ";
    if (n > 0 && (n - 1) % stride != 0)
      pts += num(x(n - 1)) + "," + num(to_y(value(r.timeline[n - 1])));
    return pts;
  };
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
    << "\" viewBox=\"0 0 " << kWidth << " " << kHeight
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  o << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o << "<text x=\"" << kLeft << "\" y=\"22\" font-size=\"15\">" << escape(title) << "</text>\n";
  // Axes and grid.
  for (int k = 0; k <= 4; ++k) {
    const double v = ymax * k / 4, yy = y(v);
    o << "<line x1=\"" << kLeft << "\" y1=\"" << num(yy) << "\" x2=\"" << kLeft + pw << "\" y2=\""
      << num(yy) << "\" stroke=\"#ddd\"/>\n";
    o << "<text x=\"" << kLeft - 6 << "\" y=\"" << num(yy + 4) << "\" text-anchor=\"end\">"
      << static_cast<long long>(v) << "</text>\n";
    o << "<text x=\"" << kLeft + pw + 6 << "\" y=\"" << num(yy + 4) << "\">" << 25 * k
      << "%</text>\n";
  }
  for (int k = 0; k <= 4; ++k) {
    const double xx = kLeft + pw * k / 4;
    o << "<text x=\"" << num(xx) << "\" y=\"" << kTop + ph + 18 << "\" text-anchor=\"middle\">"
      << static_cast<long long>(xmax * k / 4) << "</text>\n";
  }
  o << "<rect x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << pw << "\" height=\"" << ph
    << "\" fill=\"none\" stroke=\"#333\"/>\n";
  o << "<text x=\"" << kLeft + pw / 2 << "\" y=\"" << kHeight - 12
    << "\" text-anchor=\"middle\">step</text>\n";
  o << "<text transform=\"translate(18," << kTop + ph / 2
    << ") rotate(-90)\" text-anchor=\"middle\">blocks</text>\n";
  o << "<text transform=\"translate(" << kWidth - 14 << "," << kTop + ph / 2
    << ") rotate(90)\" text-anchor=\"middle\">prefix hit rate (cumulative)</text>\n";
  // Capacities.
  o << "<line x1=\"" << kLeft << "\" y1=\"" << num(y(static_cast<double>(cache.num_device_blocks)))
    << "\" x2=\"" << kLeft + pw << "\" y2=\""
    << num(y(static_cast<double>(cache.num_device_blocks)))
    << "\" stroke=\"#1f77b4\" stroke-dasharray=\"6 4\"/>\n";
  if (cache.num_host_blocks > 0)
    o << "<line x1=\"" << kLeft << "\" y1=\"" << num(y(static_cast<double>(cache.num_host_blocks)))
      << "\" x2=\"" << kLeft + pw << "\" y2=\""
      << num(y(static_cast<double>(cache.num_host_blocks)))
      << "\" stroke=\"#ff7f0e\" stroke-dasharray=\"6 4\"/>\n";
  struct Series {
    const char* name;
    const char* color;
    std::string points;
  };
  const Series series[] = {
      {"device: referenced + cached", "#1f77b4",
       line(
           [](const StepRecord& t) { return static_cast<double>(t.device_used + t.device_cached); },
           y)},
      {"device: referenced", "#9ecae1",
       line([](const StepRecord& t) { return static_cast<double>(t.device_used); }, y)},
      {"host: referenced + cached", "#ff7f0e",
       line([](const StepRecord& t) { return static_cast<double>(t.host_used + t.host_cached); },
            y)},
      {"prefix hit rate", "#2ca02c", line([](const StepRecord& t) { return t.hit_rate; }, y_rate)},
  };
  int k = 0;
  for (const Series& s : series) {
    o << "<polyline fill=\"none\" stroke=\"" << s.color << "\" stroke-width=\"2\" points=\""
      << s.points << "\"/>\n";
    const double lx = kLeft + 10 + 215 * k++;
    o << "<rect x=\"" << lx << "\" y=\"" << kTop + 8 << "\" width=\"14\" height=\"4\" fill=\""
      << s.color << "\"/><text x=\"" << lx + 18 << "\" y=\"" << kTop + 14 << "\">" << s.name
      << "</text>\n";
  }
  o << "</svg>\n";
  return o.str();
}

Status write_svg(const std::string& path, const CacheConfig& cache, const SimResult& r,
                 const std::string& title) {
  std::ofstream out(path);
  if (!out) return unavailable("cannot write " + path);
  out << render_svg(cache, r, title);
  out.flush();
  return out ? ok_status() : unavailable("writing " + path + " failed");
}

}  // namespace sim
}  // namespace pagedkv
