// Left-aligned text columns with a header row, for railctl's human output.
#pragma once

#include <string>
#include <vector>

namespace railyard::railctl {

class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header);
  // A row with as many cells as the header (missing cells print empty).
  void AddRow(std::vector<std::string> cells);
  bool empty() const { return rows_.empty(); }
  // Columns separated by two spaces, no trailing spaces, one line per row.
  std::string Render() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// "0 B", "512 B", "1.5 KiB", "64.0 MiB", "2.0 GiB".
std::string FormatBytes(uint64_t bytes);
// "42s", "3m05s", "2h03m", "5d02h".
std::string FormatDuration(double seconds);

}  // namespace railyard::railctl
