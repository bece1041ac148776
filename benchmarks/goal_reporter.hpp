// GoalReporter: Google Benchmark's display reporter, then a line per run naming its figure
// against the goal it has, under a heading, so a benchmark states its goals and whether they
// were met in the same output as its table. The benchmark says what a run's line is (judge);
// the reporter does the rest.
#pragma once

#include <benchmark/benchmark.h>

#include <functional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace pagedkv::bench {

class GoalReporter : public benchmark::BenchmarkReporter {
 public:
  /// A successful run's goal line ("" for none).
  using Judge = std::function<std::string(const Run& run)>;

  /// `inner` (not owned: benchmark::CreateDefaultDisplayReporter() keeps its own) prints the
  /// table; `heading` opens the goal lines; `has_goal` says which runs have one (a failed one
  /// of those is reported as skipped); `judge` writes a successful one's line.
  GoalReporter(benchmark::BenchmarkReporter* inner, std::string heading,
               std::function<bool(const std::string& name)> has_goal, Judge judge)
      : inner_(inner),
        heading_(std::move(heading)),
        has_goal_(std::move(has_goal)),
        judge_(std::move(judge)) {}

  bool ReportContext(const Context& context) override {
    inner_->SetOutputStream(&GetOutputStream());
    inner_->SetErrorStream(&GetErrorStream());
    return inner_->ReportContext(context);
  }

  void ReportRuns(const std::vector<Run>& runs) override {
    inner_->ReportRuns(runs);
    for (const Run& run : runs) {
      // Each repetition, and the median when there are several (--benchmark_repetitions).
      if (run.run_type == Run::RT_Aggregate && run.aggregate_name != "median") continue;
      const std::string name = run.benchmark_name();
      if (!has_goal_(name)) continue;
      if (run.error_occurred) {
        lines_.push_back(name + ": skipped (" + run.error_message + "), no figures");
        continue;
      }
      std::string line = judge_(run);
      if (!line.empty()) lines_.push_back(std::move(line));
    }
  }

  /// The goal lines, after the table: on stdout under the console format, on stderr under json
  /// or csv so that their output stays parseable.
  void Finalize() override {
    inner_->Finalize();
    if (lines_.empty()) return;
    const bool console = dynamic_cast<benchmark::ConsoleReporter*>(inner_) != nullptr;
    std::ostream& out = console ? GetOutputStream() : GetErrorStream();
    out << "\n" << heading_ << "\n";
    for (const std::string& line : lines_) out << "  " << line << "\n";
  }

 private:
  benchmark::BenchmarkReporter* inner_;  // not owned
  std::string heading_;
  std::function<bool(const std::string&)> has_goal_;
  Judge judge_;
  std::vector<std::string> lines_;
};

}  // namespace pagedkv::bench
