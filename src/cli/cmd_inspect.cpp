// `sparsebalance inspect PATH [--json]`: what is in a file. Dispatches on the root attribute
// `format` (a directory is judged by its first *.h5 file): shards and datasets here; checkpoints
// and metrics logs get their own branches.
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "io/h5.hpp"
#include "io/shard.hpp"
#include "src/cli/args.hpp"
#include "src/comm/comm.hpp"
#include "src/common/error.hpp"
#include "src/data/inspect.hpp"

namespace sb {

namespace {

// The root `format` attribute of PATH (or of the first *.h5 file of a directory).
std::string file_format(const std::string& path) {
  std::string file = shard_files(path).front();
  h5::Id f = h5::open_read(file);
  if (!h5::has_attr(f, "format")) return "";
  return h5::read_attr_string(f, "format", file);
}

int inspect_dataset(const std::string& path, bool json) {
  auto ds = Dataset::open(path);
  auto report = dataset_report(ds, /*verify=*/true);
  if (json) std::printf("%s\n", report.dump(2).c_str());
  else std::printf("%s", format_dataset_report(report).c_str());
  return 0;
}

int run(const Args& args) {
  Comm comm;
  if (args.positional.size() != 1)
    throw Error("sparsebalance inspect: expected one PATH (a shard, a dataset directory), got " +
                std::to_string(args.positional.size()) + " (see sparsebalance inspect --help)");
  const std::string& path = args.positional[0];
  int rc = 0;
  if (comm.root()) {  // one rank reads and prints; the others only wait
    std::string format = file_format(path);
    if (format == kShardFormat) rc = inspect_dataset(path, args.has("json"));
    else throw Error(path + ": not a SparseBalance shard/dataset (format attribute '" + format + "')");
  }
  comm.barrier();
  return rc;
}

}  // namespace

Command cmd_inspect() {
  return {"inspect",
          "print what a shard or dataset holds (counts, length statistics, tasks); verifies token ids",
          "inspect PATH [--json]\n\n"
          "PATH is a shard file or a directory of shards. Prints documents, tokens, vocabulary, tokenizer,\n"
          "shards, document length statistics (min, median, p90, p99, max, mean), a log2 length histogram\n"
          "and task counts, after checking every token id against vocab_size.\n",
          {{"json", 0, "print the report as JSON on stdout", ""}},
          run};
}

}  // namespace sb
