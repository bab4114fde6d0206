// Several ranks read disjoint documents of the same shards at once (read-only opens), and each
// checks what it read against the generator that wrote it.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <filesystem>

#include "io/shard.hpp"
#include "src/data/prep.hpp"
#include "src/data/tokenizer.hpp"

TEST(DatasetMpi, RanksReadDisjointDocumentsOfTheSameShards) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // One directory for the whole job: rank 0 names it and writes the shards.
  char dir[256] = {};
  if (rank == 0) {
    auto p = std::filesystem::temp_directory_path() / ("sb_data_mpi_" + std::to_string(::getpid()));
    std::filesystem::remove_all(p);
    std::snprintf(dir, sizeof dir, "%s", p.c_str());
  }
  MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
  sb::SynthOptions so;
  so.preset = "longalign", so.docs = 120, so.seed = 77, so.max_len = 20000, so.min_len = 16;
  if (rank == 0) {
    sb::PrepOptions po;
    po.output = dir, po.shard_tokens = 60000;  // several shards
    sb::prep_synth(so, po);
  }
  MPI_Barrier(MPI_COMM_WORLD);

  auto ds = sb::Dataset::open(dir);  // every rank holds the same shards open read-only
  ASSERT_EQ(ds.num_docs(), so.docs);
  ASSERT_GT(ds.shards().size(), 2u);
  sb::SynthCorpus corpus(so);
  // Each rank takes a disjoint, interleaved subset and reads it in reverse, so the ranks'
  // reads overlap in time and touch the same shards.
  int64_t mine = 0, tokens = 0;
  for (int64_t d = int64_t(ds.num_docs()) - 1; d >= 0; --d) {
    if (d % size != rank) continue;
    auto want = corpus.doc(uint64_t(d));
    ASSERT_EQ(sb::ByteTokenizer::decode(ds.read_doc(uint64_t(d))), want.text) << "doc " << d << " rank " << rank;
    EXPECT_EQ(ds.task(uint64_t(d)).type, want.task.type);
    EXPECT_EQ(ds.task(uint64_t(d)).begin, want.task.begin);
    ++mine, tokens += int64_t(want.text.size());
  }
  int64_t all = 0, all_tokens = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&tokens, &all_tokens, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(uint64_t(all), ds.num_docs());  // together the ranks covered every document once
  EXPECT_EQ(uint64_t(all_tokens), ds.num_tokens());
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::filesystem::remove_all(dir);
}
