#include "src/train/batch_log.hpp"

#include <fstream>

#include "base/error.hpp"
#include "src/train/batch.hpp"

namespace sb {

void append_batch_log(const std::string& path, int64_t step, bool fresh, const Dataset& ds,
                      const std::vector<Segment>& segs, int64_t targets) {
  std::ofstream out(path, fresh ? std::ios::trunc : std::ios::app);
  if (!out) throw Error("log.batches = \"" + path + "\": cannot open for writing");
  out << "{\"step\": " << step << ", \"targets\": " << targets << ", \"segments\": [";
  for (size_t i = 0; i < segs.size(); ++i) {
    const Segment& s = segs[i];
    PackedBatch b;
    b.add(read_segment(ds, s));
    mask_targets(ds, s, b, 0);
    out << (i ? ", " : "") << "{\"doc\": " << s.doc << ", \"begin\": " << s.begin << ", \"tokens\": [";
    for (size_t t = 0; t < b.tokens.size(); ++t) out << (t ? "," : "") << b.tokens[t];
    out << "], \"targets\": [";
    for (size_t t = 0; t < b.targets.size(); ++t) out << (t ? "," : "") << b.targets[t];
    out << "]}";
  }
  out << "]}\n";
  if (!out.flush()) throw Error("log.batches = \"" + path + "\": write failed");
}

}  // namespace sb
