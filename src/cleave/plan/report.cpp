#include "cleave/plan/report.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "cleave/base/check.h"

namespace cleave {

namespace {

std::string escaped(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

double mib(int64_t bytes) { return double(bytes) / (1 << 20); }


// Each rank a cell, in rows of one host; data-<axis> holds the rank's group along each axis (the
// ranks that differ only in that axis's coordinate share it), which the page's script colours.
std::string mesh_section(const Mesh& mesh, int per_host) {
  const int world = mesh.world(), cols = std::min(per_host > 0 ? per_host : world, 16);
  const int hosts_per_row = std::max(1, 16 / cols);
  const int cell = 28, gap = 14;
  const int hosts = (world + cols - 1) / cols;
  const int rows = (hosts + hosts_per_row - 1) / hosts_per_row;
  const int width = hosts_per_row * (cols * cell + gap) + gap, height = rows * (cell + gap) + gap;
  std::string controls, svg;
  for (Axis a : kMeshAxes)
    if (mesh.degree(a) > 1 || a == Axis::tp)
      controls += std::string("<label><input type=\"radio\" name=\"axis\" value=\"") +
                  axis_name(a) + "\"" + (controls.empty() ? " checked" : "") + "> " +
                  axis_name(a) + " " + std::to_string(mesh.degree(a)) + "</label> ";
  for (int r = 0; r < world; ++r) {
    const int host = r / cols, slot = r % cols;
    const int x = gap + (host % hosts_per_row) * (cols * cell + gap) + slot * cell;
    const int y = gap + (host / hosts_per_row) * (cell + gap);
    std::string data;
    const std::array<int, kAxes> c = mesh.coords(r);
    for (Axis a : kMeshAxes) {
      std::array<int, kAxes> key = c;
      key[size_t(a)] = 0;
      data += std::string(" data-") + axis_name(a) + "=\"" + std::to_string(mesh.rank_of(key)) +
              "\"";
    }
    svg += "<g class=\"rank\"" + data + "><rect x=\"" + std::to_string(x) + "\" y=\"" +
           std::to_string(y) + "\" width=\"" + std::to_string(cell - 2) + "\" height=\"" +
           std::to_string(cell - 2) + "\"/><text x=\"" + std::to_string(x + cell / 2 - 1) +
           "\" y=\"" + std::to_string(y + cell / 2 + 3) + "\">" + std::to_string(r) +
           "</text><title>rank " + std::to_string(r) + "</title></g>";
  }
  for (int h = 0; h < hosts; ++h) {
    const int x = gap + (h % hosts_per_row) * (cols * cell + gap) - 4;
    const int y = gap + (h / hosts_per_row) * (cell + gap) - 4;
    const int n = std::min(cols, world - h * cols);
    svg += "<rect class=\"host\" x=\"" + std::to_string(x) + "\" y=\"" + std::to_string(y) +
           "\" width=\"" + std::to_string(n * cell + 6) + "\" height=\"" +
           std::to_string(cell + 6) + "\"><title>host " + std::to_string(h) + "</title></rect>";
  }
  return "<section id=\"mesh\"><h2>Device mesh</h2><p>Each rank a cell, each host boxed (" +
         std::to_string(cols) + " ranks per host); colour: the rank's group on " + controls +
         "</p><svg width=\"" + std::to_string(width) + "\" height=\"" + std::to_string(height) +
         "\">" + svg + "</svg></section>";
}

std::string memory_section(const std::vector<MemoryPlan>& stages, int64_t capacity) {
  struct Part {
    const char* name;
    const char* colour;
    int64_t (*bytes)(const MemoryPlan&);
  };
  static const Part parts[] = {
      {"values", "#4e79a7", [](const MemoryPlan& p) { return p.parameters; }},
      {"gradients", "#f28e2b", [](const MemoryPlan& p) { return p.gradients; }},
      {"optimizer", "#e15759", [](const MemoryPlan& p) { return p.optimizer; }},
      {"weight copies", "#76b7b2", [](const MemoryPlan& p) { return p.weight_copies; }},
      {"activations", "#59a14f", [](const MemoryPlan& p) { return p.activations.total(); }},
      {"backward scratch", "#edc948", [](const MemoryPlan& p) { return p.backward_scratch; }},
      {"product scratch", "#ff9da7", [](const MemoryPlan& p) { return p.product_scratch; }},
      {"comm buffers", "#b07aa1", [](const MemoryPlan& p) { return p.comm_buffers; }}};
  int64_t most = capacity;
  for (const MemoryPlan& p : stages) most = std::max(most, p.total());
  CLEAVE_CHECK(most > 0, "plan report: no memory to draw");
  const double width = 640, label = 70, bar = 22;
  std::string svg, legend;
  for (const Part& part : parts)
    legend += std::string("<span class=\"key\" style=\"background:") + part.colour + "\"></span>" +
              part.name + " ";
  int row = 0;
  for (const MemoryPlan& p : stages) {
    const double y = 10 + row++ * (bar + 8);
    double x = label;
    svg += "<text x=\"4\" y=\"" + fmt("%.0f", y + 15) + "\">stage " + std::to_string(p.pp_rank) +
           "</text>";
    for (const Part& part : parts) {
      const double w = width * double(part.bytes(p)) / double(most);
      svg += "<rect x=\"" + fmt("%.1f", x) + "\" y=\"" + fmt("%.0f", y) + "\" width=\"" +
             fmt("%.1f", w) + "\" height=\"" + fmt("%.0f", bar) + "\" fill=\"" + part.colour +
             "\"><title>stage " + std::to_string(p.pp_rank) + " " + part.name + ": " +
             fmt("%.1f MiB", mib(part.bytes(p))) + "</title></rect>";
      x += w;
    }
    svg += "<text x=\"" + fmt("%.1f", x + 4) + "\" y=\"" + fmt("%.0f", y + 15) + "\">" +
           fmt("%.1f MiB", mib(p.total())) + "</text>";
  }
  const double height = 20 + row * (bar + 8);
  if (capacity > 0)
    svg += "<line class=\"capacity\" x1=\"" + fmt("%.1f", label + width) + "\" x2=\"" +
           fmt("%.1f", label + width) + "\" y1=\"0\" y2=\"" + fmt("%.0f", height) +
           "\"><title>device memory " + fmt("%.0f MiB", mib(capacity)) + "</title></line>";
  return "<section id=\"memory\"><h2>Memory per rank</h2><p>" + legend +
         (capacity > 0 ? "; the line: the device's " + fmt("%.0f MiB", mib(capacity))
                       : std::string("; device memory not given")) +
         "</p><svg width=\"" + fmt("%.0f", label + width + 90) + "\" height=\"" +
         fmt("%.0f", height) + "\">" + svg + "</svg></section>";
}

std::string timeline_section(const std::vector<TraceEvent>& events, const std::string& cluster) {
  static const std::map<char, const char*> colour = {
      {'F', "#4e79a7"}, {'B', "#e15759"}, {'I', "#f28e2b"}, {'W', "#59a14f"}, {'R', "#b07aa1"}};
  double end = 0;
  int ranks = 0;
  for (const TraceEvent& e : events) {
    end = std::max(end, e.start_us + e.duration_us);
    ranks = std::max(ranks, e.rank + 1);
  }
  const double width = 720, label = 60, row = 24;
  std::string svg;
  for (int r = 0; r < ranks; ++r)
    svg += "<text x=\"4\" y=\"" + fmt("%.0f", 8 + r * row + 15) + "\">pp " + std::to_string(r) +
           "</text>";
  for (const TraceEvent& e : events) {
    if (end <= 0) break;
    const char type = e.name.find_first_of("FBIWR") != std::string::npos
                          ? e.name[e.name.find_first_of("FBIWR")]
                          : 'F';
    const auto c = colour.find(type);
    svg += "<rect class=\"action\" x=\"" + fmt("%.1f", label + width * e.start_us / end) +
           "\" y=\"" + fmt("%.0f", 8 + e.rank * row) + "\" width=\"" +
           fmt("%.1f", std::max(1.0, width * e.duration_us / end - 1)) + "\" height=\"" +
           fmt("%.0f", row - 4) + "\" fill=\"" + (c == colour.end() ? "#999" : c->second) +
           "\"><title>" + escaped(e.name) +
           (cluster.empty() ? std::string() : fmt(": %.3f ms", e.duration_us / 1e3)) +
           "</title></rect>";
  }
  const std::string timed =
      cluster.empty() ? "The schedule's actions simulated on unit costs (F 1, B 2, I and W 1)"
                      : "The step program simulated on " + escaped(cluster) + "'s costs (" +
                            fmt("%.1f ms", end / 1e3) + " per step)";
  return "<section id=\"timeline\"><h2>Pipeline timeline</h2><p>" + timed +
         ", per pipeline rank: F forward, B backward, I and W its input and weight halves, R a "
         "recompute (stage, type, micro-batch); the white between them is the bubble and the "
         "waits for collectives.</p><svg width=\"" +
         fmt("%.0f", label + width + 10) + "\" height=\"" + fmt("%.0f", 12 + ranks * row) +
         "\">" + svg + "</svg></section>";
}

// A horizontal bar per row, as long as its value against the largest, with the row's label on
// its left and its value's text on its right: the axes' bytes, the search's layouts.
struct Bar {
  std::string label, tooltip, value_text;
  double value = 0;
  std::string fill = "#4e79a7", css_class;
};

std::string bar_chart(const std::vector<Bar>& bars, double label_width, double width) {
  double most = 0;
  for (const Bar& b : bars) most = std::max(most, b.value);
  const double bar = 20;
  std::string svg;
  int row = 0;
  for (const Bar& b : bars) {
    const double y = 6 + row++ * (bar + 6);
    const double w = most > 0 ? width * b.value / most : 0;
    svg += "<text x=\"4\" y=\"" + fmt("%.0f", y + 14) + "\">" + escaped(b.label) + "</text><rect" +
           (b.css_class.empty() ? "" : " class=\"" + b.css_class + "\"") + " x=\"" +
           fmt("%.0f", label_width) + "\" y=\"" + fmt("%.0f", y) + "\" width=\"" +
           fmt("%.1f", w) + "\" height=\"" + fmt("%.0f", bar) + "\" fill=\"" + b.fill +
           "\"><title>" + escaped(b.tooltip) + "</title></rect><text x=\"" +
           fmt("%.1f", label_width + w + 4) + "\" y=\"" + fmt("%.0f", y + 14) + "\">" +
           escaped(b.value_text) + "</text>";
  }
  return "<svg width=\"" + fmt("%.0f", label_width + width + 110) + "\" height=\"" +
         fmt("%.0f", 12 + row * (bar + 6)) + "\">" + svg + "</svg>";
}

std::string axes_section(const std::vector<AxisBytes>& axes) {
  std::vector<Bar> bars;
  for (const AxisBytes& a : axes)
    bars.push_back({a.axis, a.how, fmt("%.2f MiB", a.bytes / (1 << 20)), a.bytes, "#4e79a7", ""});
  return "<section id=\"axes\"><h2>Bytes per step on each mesh axis</h2><p>" +
         std::string(axes.empty() ? "None: a single rank." : "Sent by one rank per step.") +
         "</p>" + bar_chart(bars, 110, 520) + "</section>";
}

// The search's best layouts: a bar of predicted tokens/s each, the best on top.
std::string search_section(const std::vector<RankedLayout>& ranked) {
  if (ranked.empty()) return "";
  std::vector<Bar> bars;
  for (const RankedLayout& l : ranked)
    bars.push_back({std::to_string(bars.size() + 1) + ". " + l.label,
                    fmt("step %.1f ms", 1e3 * l.step_seconds) + fmt(", MFU %.1f%%", 100 * l.mfu) +
                        fmt(", %.2f GiB per rank", double(l.peak_bytes) / (1 << 30)),
                    fmt("%.0f tokens/s", l.tokens_per_second), l.tokens_per_second,
                    bars.empty() ? "#59a14f" : "#4e79a7", "layout"});
  return "<section id=\"search\"><h2>Ranked layouts</h2><p>The search's best layouts that fit "
         "in the device's memory, by predicted tokens/s.</p>" +
         bar_chart(bars, 420, 360) + "</section>";
}

}  // namespace

std::string plan_report_html(const PlanReport& r) {
  CLEAVE_CHECK(r.mesh != nullptr, "plan report: no mesh");
  static const char* style =
      "body{font:14px sans-serif;margin:20px;color:#222}h1{font-size:20px}h2{font-size:16px;"
      "margin-top:24px}svg text{font-size:11px}.rank text{text-anchor:middle;fill:#fff;"
      "pointer-events:none}.host{fill:none;stroke:#333;stroke-width:1.5}.capacity{stroke:#000;"
      "stroke-width:2;stroke-dasharray:4 3}.key{display:inline-block;width:10px;height:10px;"
      "margin:0 4px 0 10px}";
  // Colours each rank by its group on the checked axis: a group's cells share a hue.
  static const char* script =
      "function paint(){const axis=document.querySelector('input[name=axis]:checked').value;"
      "const groups=[...new Set([...document.querySelectorAll('.rank')].map(g=>g.dataset[axis]))];"
      "document.querySelectorAll('.rank').forEach(g=>{const i=groups.indexOf(g.dataset[axis]);"
      "g.querySelector('rect').setAttribute('fill','hsl('+Math.round(360*i/groups.length)+"
      "',55%,45%)');});}"
      "document.querySelectorAll('input[name=axis]').forEach(i=>i.addEventListener('change',"
      "paint));paint();";
  return std::string("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>") +
         escaped(r.title) + "</title><style>" + style + "</style></head><body><h1>" +
         escaped(r.title) + "</h1>" + mesh_section(*r.mesh, r.ranks_per_host) +
         memory_section(r.stages, r.capacity_bytes) +
         timeline_section(r.timeline, r.timeline_cluster) + axes_section(r.axes) +
         search_section(r.ranked) + "<script>" + script + "</script></body></html>\n";
}

}  // namespace cleave
