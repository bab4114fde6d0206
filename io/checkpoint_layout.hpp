// The pieces of a checkpoint file that the whole-file writer (checkpoint.cpp) and the sliced
// writer (checkpoint_slices.cpp) share: one layout, one checksum. Internal to io/.
#pragma once
#include <hdf5.h>

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "io/checkpoint.hpp"

namespace sb {

// fnv1a over step, data cursor and config; the checksum continues it over the bytes of params,
// m and v in flat order (so ranks can hash their slices in turn).
uint64_t checksum_head(const Checkpoint& ck);
// Over the datasets the trainer adds (stored as attribute 'checksum_extra').
uint64_t checksum_extra(hid_t f, const std::string& file);
// The root attributes (format, version, step, ranks, num_params, checksum), /config,
// /param_names and /state.
void write_meta(hid_t f, const Checkpoint& ck, size_t num_params, uint64_t checksum);
void write_text(hid_t loc, const std::string& name, const std::string& text);
std::string read_text(hid_t loc, const std::string& name, const std::string& file);  // heap-checked
void fsync_path(const std::string& path, bool dir);

// Shared by read_checkpoint and read_checkpoint_slice: everything but the tensors' values (format,
// version, step, cursor, config, the tensor names in ck.tensors, shapes and sizes not yet known).
Checkpoint read_meta(hid_t f, const std::string& path);
// Opens /params/<name> (float32) of each tensor, records shapes, sizes and offsets in
// ck.tensors, checks /optim/m and /optim/v hold as many values and 'num_params' their sum.
// Returns the number of parameters; reads no values.
size_t read_shapes(hid_t f, Checkpoint& ck, const std::string& path);
// Compares the stored 'checksum' with `sum`, then 'checksum_extra' (when stored) with the added
// groups' (read from `f`); throws the corrupt-checkpoint errors.
void verify_checksums(hid_t f, const std::string& path, uint64_t sum);

// Selects the row-major flat range [a, b) of a dataset of extent `dims` (a partial first row,
// whole rows, a partial last row) and writes (`write`) or reads it from/into `data`, b - a values.
// An empty range still makes the call (a collective transfer needs every rank).
void transfer_flat(hid_t ds, const CheckpointTensor& t, hsize_t a, hsize_t b, float* data, hid_t dxpl, bool write);

// Every rank learns whether any failed; the lowest failing rank's message becomes everyone's.
void agree(MPI_Comm comm, std::string& err);
void mpi_check(int rc, const char* what);

}  // namespace sb
