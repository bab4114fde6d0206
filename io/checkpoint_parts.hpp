// The pieces of a checkpoint file that the whole-file writer (checkpoint.cpp) and the sharded
// writer (checkpoint_sharded.cpp) share: one layout, one checksum. Internal to io/.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <string>

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
void fsync_path(const std::string& path, bool dir);

}  // namespace sb
