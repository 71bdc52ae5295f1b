#include "engine/gguf/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace heavykv {

static_assert(std::endian::native == std::endian::little,
              "GGUF is little-endian and is read in place");

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr uint64_t kHeaderBytes = 24;        // magic, version, tensor count, metadata count
// The smallest a metadata entry (key length, type, one byte) and a tensor info (name length,
// n_dims, one dimension, type, offset) can be: bounds on the counts before anything is reserved.
constexpr uint64_t kMinMetadataBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;
constexpr uint32_t kMaxDims = 4;

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

bool ValidValueType(uint32_t id) { return id <= static_cast<uint32_t>(GgufValueType::kF64); }

std::string U128(unsigned __int128 v) {
  std::string digits;
  do {
    digits.insert(digits.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  } while (v != 0);
  return digits;
}

}  // namespace

// Reads the header of a mapped file into a GgufFile, checking every field against the bytes
// left before using it. Positions are uint64_t offsets into the mapping; `pos_ <= size_` always.
class GgufParser {
 public:
  explicit GgufParser(GgufFile* f) : f_(*f), p_(f->map_), size_(f->size_) {}

  absl::Status Parse() {
    auto magic = U32("header", "magic");
    if (!magic.ok()) return magic.status();
    if (*magic != kGgufMagic) {
      return Error("header", absl::StrFormat("not a GGUF file (magic 0x%08x, want 0x%08x \"GGUF\")",
                                             *magic, kGgufMagic));
    }
    auto version = U32("header", "version");
    if (!version.ok()) return version.status();
    if (*version == 1) {
      return Error("header",
                   "GGUF version 1 is not supported (it used 32-bit counts); convert the model "
                   "again with a current llama.cpp");
    }
    if (*version != 2 && *version != 3) {
      const uint32_t swapped = __builtin_bswap32(*version);
      return Error(
          "header",
          absl::StrCat(
              "GGUF version ", *version, " is not supported (2 and 3 are)",
              swapped == 2 || swapped == 3 ? "; this looks like a big-endian GGUF file" : ""));
    }
    f_.version_ = *version;
    auto num_tensors = U64("header", "tensor count");
    if (!num_tensors.ok()) return num_tensors.status();
    auto num_metadata = U64("header", "metadata count");
    if (!num_metadata.ok()) return num_metadata.status();
    if (*num_metadata > Left() / kMinMetadataBytes) {
      return Error("header", absl::StrCat("metadata count ", *num_metadata, " cannot fit in the ",
                                          Left(), " bytes left"));
    }
    if (*num_tensors > Left() / kMinTensorInfoBytes) {
      return Error("header", absl::StrCat("tensor count ", *num_tensors, " cannot fit in the ",
                                          Left(), " bytes left"));
    }

    f_.metadata_.reserve(*num_metadata);
    for (uint64_t i = 0; i < *num_metadata; ++i) {
      if (absl::Status s = ParseMetadata(i); !s.ok()) return s;
    }
    if (absl::Status s = ReadAlignment(); !s.ok()) return s;

    f_.tensors_.reserve(*num_tensors);
    for (uint64_t i = 0; i < *num_tensors; ++i) {
      if (absl::Status s = ParseTensorInfo(i); !s.ok()) return s;
    }
    return PlaceTensors();
  }

 private:
  uint64_t Left() const { return size_ - pos_; }

  absl::Status Error(absl::string_view where, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(f_.path_, ": ", where, ": ", what));
  }
  absl::Status Need(uint64_t n, absl::string_view where, absl::string_view what) const {
    if (n <= Left()) return absl::OkStatus();
    return Error(where, absl::StrCat(what, " needs ", n, " bytes at offset ", pos_,
                                     " but the file ends at ", size_, " (truncated?)"));
  }
  template <typename T>
  absl::StatusOr<T> Read(absl::string_view where, absl::string_view what) {
    if (absl::Status s = Need(sizeof(T), where, what); !s.ok()) return s;
    T v = Load<T>(p_ + pos_);
    pos_ += sizeof(T);
    return v;
  }
  absl::StatusOr<uint32_t> U32(absl::string_view where, absl::string_view what) {
    return Read<uint32_t>(where, what);
  }
  absl::StatusOr<uint64_t> U64(absl::string_view where, absl::string_view what) {
    return Read<uint64_t>(where, what);
  }
  absl::StatusOr<absl::string_view> String(absl::string_view where, absl::string_view what) {
    auto len = U64(where, absl::StrCat(what, " length"));
    if (!len.ok()) return len.status();
    if (*len > Left()) {
      return Error(where, absl::StrCat(what, " length ", *len, " at offset ", pos_ - 8,
                                       " is longer than the ", Left(), " bytes left"));
    }
    absl::string_view s(reinterpret_cast<const char*>(p_ + pos_), *len);
    pos_ += *len;
    return s;
  }

  absl::Status ParseMetadata(uint64_t index) {
    const std::string where = absl::StrCat("metadata #", index);
    auto key = String(where, "key");
    if (!key.ok()) return key.status();
    const std::string at = absl::StrCat("metadata key '", *key, "'");
    auto type_id = U32(at, "value type");
    if (!type_id.ok()) return type_id.status();
    if (!ValidValueType(*type_id)) {
      return Error(at, absl::StrCat("value type ", *type_id, " is not a GGUF value type (0..12)"));
    }
    GgufMetadata m;
    m.key = *key;
    m.type = static_cast<GgufValueType>(*type_id);
    if (m.type == GgufValueType::kArray) {
      if (absl::Status s = ParseArray(at, &m); !s.ok()) return s;
    } else if (m.type == GgufValueType::kString) {
      auto s = String(at, "string");
      if (!s.ok()) return s.status();
      m.raw = {reinterpret_cast<const uint8_t*>(s->data()), s->size()};
    } else {
      const uint64_t n = GgufScalarBytes(m.type);
      if (absl::Status s = Need(n, at, GgufValueTypeName(m.type)); !s.ok()) return s;
      m.raw = {p_ + pos_, n};
      if (m.type == GgufValueType::kBool && p_[pos_] > 1) {
        return Error(at, absl::StrCat("bool value ", p_[pos_], " is not 0 or 1"));
      }
      pos_ += n;
    }
    auto [it, inserted] = f_.metadata_index_.emplace(m.key, f_.metadata_.size());
    if (!inserted) {
      return Error(at, absl::StrCat("appears twice (entries #", it->second, " and #", index, ")"));
    }
    f_.metadata_.push_back(m);
    return absl::OkStatus();
  }

  absl::Status ParseArray(const std::string& at, GgufMetadata* m) {
    auto elem = U32(at, "array element type");
    if (!elem.ok()) return elem.status();
    if (!ValidValueType(*elem)) {
      return Error(at,
                   absl::StrCat("array element type ", *elem, " is not a GGUF value type (0..12)"));
    }
    m->element_type = static_cast<GgufValueType>(*elem);
    if (m->element_type == GgufValueType::kArray) {
      return Error(at, "arrays of arrays are not supported");
    }
    auto count = U64(at, "array count");
    if (!count.ok()) return count.status();
    m->count = *count;
    const uint64_t start = pos_;
    if (m->element_type == GgufValueType::kString) {
      if (*count > Left() / 8) {
        return Error(at, absl::StrCat("array of ", *count, " strings cannot fit in the ", Left(),
                                      " bytes left"));
      }
      for (uint64_t i = 0; i < *count; ++i) {
        auto s = String(at, absl::StrCat("string #", i));
        if (!s.ok()) return s.status();
      }
    } else {
      const uint64_t n = GgufScalarBytes(m->element_type);
      if (*count > Left() / n) {
        return Error(at, absl::StrCat("array of ", *count, " ", GgufValueTypeName(m->element_type),
                                      " cannot fit in the ", Left(), " bytes left"));
      }
      if (m->element_type == GgufValueType::kBool) {
        for (uint64_t i = 0; i < *count; ++i) {
          if (p_[pos_ + i] > 1) {
            return Error(at,
                         absl::StrCat("bool element #", i, " is ", p_[pos_ + i], ", not 0 or 1"));
          }
        }
      }
      pos_ += *count * n;
    }
    m->raw = {p_ + start, pos_ - start};
    return absl::OkStatus();
  }

  absl::Status ReadAlignment() {
    const GgufMetadata* m = f_.FindMetadata("general.alignment");
    if (m == nullptr) return absl::OkStatus();
    auto a = f_.GetU64("general.alignment");
    if (!a.ok()) return a.status();
    if (*a == 0 || !std::has_single_bit(*a)) {
      return Error("metadata key 'general.alignment'",
                   absl::StrCat("alignment ", *a, " is not a power of two"));
    }
    f_.alignment_ = *a;
    return absl::OkStatus();
  }

  absl::Status ParseTensorInfo(uint64_t index) {
    auto name = String(absl::StrCat("tensor #", index), "name");
    if (!name.ok()) return name.status();
    const std::string at = absl::StrCat("tensor '", *name, "'");
    GgufTensor t;
    t.name = *name;
    auto n_dims = U32(at, "n_dims");
    if (!n_dims.ok()) return n_dims.status();
    if (*n_dims < 1 || *n_dims > kMaxDims) {
      return Error(at, absl::StrCat("n_dims ", *n_dims, " is not in 1..", kMaxDims));
    }
    t.num_dims = static_cast<int32_t>(*n_dims);
    for (uint32_t d = 0; d < *n_dims; ++d) {
      auto dim = U64(at, absl::StrCat("dimension ", d));
      if (!dim.ok()) return dim.status();
      if (*dim < 1 || *dim > uint64_t{std::numeric_limits<int64_t>::max()}) {
        return Error(at, absl::StrCat("dimension ", d, " is ", *dim, ", not in 1..2^63-1"));
      }
      t.dims[d] = static_cast<int64_t>(*dim);
    }
    auto type_id = U32(at, "type");
    if (!type_id.ok()) return type_id.status();
    std::optional<GgmlType> type = GgmlTypeFromId(*type_id);
    if (!type) return Error(at, absl::StrCat("unknown ggml type id ", *type_id));
    t.type = *type;
    auto offset = U64(at, "offset");
    if (!offset.ok()) return offset.status();
    t.offset = *offset;
    if (t.offset % f_.alignment_ != 0) {
      return Error(at, absl::StrCat("offset ", t.offset, " is not a multiple of the alignment ",
                                    f_.alignment_));
    }
    absl::StatusOr<int64_t> bytes = GgmlTensorBytes(t.type, t.shape());
    if (!bytes.ok()) return Error(at, bytes.status().message());
    t.num_elements = t.dims[0] * t.dims[1] * t.dims[2] * t.dims[3];  // fits: bytes did
    // `data` gets its pointer in PlaceTensors; until then it holds only the size.
    t.data = {static_cast<const uint8_t*>(nullptr), static_cast<size_t>(*bytes)};
    auto [it, inserted] = f_.tensor_index_.emplace(t.name, f_.tensors_.size());
    if (!inserted) {
      return Error(at, absl::StrCat("appears twice (tensors #", it->second, " and #", index, ")"));
    }
    f_.tensors_.push_back(t);
    return absl::OkStatus();
  }

  // The data section starts at the first aligned offset after the tensor infos; each tensor's
  // bytes must lie inside the file, and no two tensors may share a byte.
  absl::Status PlaceTensors() {
    const uint64_t a = f_.alignment_;
    const uint64_t pad = (a - pos_ % a) % a;
    if (f_.tensors_.empty()) {
      f_.data_offset_ = std::min<uint64_t>(size_, pos_ + std::min<uint64_t>(pad, Left()));
      return absl::OkStatus();
    }
    if (pad > Left()) {
      return Error("data section",
                   absl::StrCat("starts at ", pos_, " + ", pad,
                                " bytes of padding, past the end of the file (size ", size_, ")"));
    }
    f_.data_offset_ = pos_ + pad;
    const uint64_t data_bytes = size_ - f_.data_offset_;
    for (GgufTensor& t : f_.tensors_) {
      const uint64_t n = t.data.size();
      if (t.offset > data_bytes || n > data_bytes - t.offset) {
        // Printed as absolute file offsets, computed in 128 bits so that they never wrap.
        const unsigned __int128 begin = static_cast<unsigned __int128>(f_.data_offset_) + t.offset;
        return Error(absl::StrCat("tensor '", t.name, "'"),
                     absl::StrCat("data [", U128(begin), ", ", U128(begin + n),
                                  ") ends past the end of the file (size ", size_, ")"));
      }
      t.data = {p_ + f_.data_offset_ + t.offset, n};
    }
    std::vector<const GgufTensor*> by_offset;
    by_offset.reserve(f_.tensors_.size());
    for (const GgufTensor& t : f_.tensors_) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(),
              [](const GgufTensor* x, const GgufTensor* y) { return x->offset < y->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
      const GgufTensor& prev = *by_offset[i - 1];
      const GgufTensor& cur = *by_offset[i];
      if (prev.offset + prev.data.size() > cur.offset) {
        return Error(absl::StrCat("tensor '", cur.name, "'"),
                     absl::StrCat("data at offset ", cur.offset, " overlaps tensor '", prev.name,
                                  "' [", prev.offset, ", ", prev.offset + prev.data.size(),
                                  ") (offsets from the data section at ", f_.data_offset_, ")"));
      }
    }
    return absl::OkStatus();
  }

  GgufFile& f_;
  const uint8_t* p_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

absl::StatusOr<GgufFile> GgufFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  if (st.st_size < static_cast<off_t>(kHeaderBytes)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": header: the file has ", st.st_size, " bytes, fewer than a GGUF header's ",
        kHeaderBytes, " (truncated, or not a GGUF file)"));
  }
  void* map = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps the file
  if (map == MAP_FAILED) {
    return absl::InternalError(
        absl::StrCat(path, ": cannot map the file: ", std::strerror(map_errno)));
  }
  GgufFile f;
  f.path_ = path;
  f.map_ = static_cast<const uint8_t*>(map);
  f.size_ = static_cast<uint64_t>(st.st_size);
  if (absl::Status s = GgufParser(&f).Parse(); !s.ok()) return s;  // ~GgufFile unmaps
  return f;
}

GgufFile::GgufFile(GgufFile&& other) noexcept { *this = std::move(other); }

GgufFile& GgufFile::operator=(GgufFile&& other) noexcept {
  if (this != &other) {
    Unmap();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    size_ = std::exchange(other.size_, 0);
    version_ = other.version_;
    alignment_ = other.alignment_;
    data_offset_ = other.data_offset_;
    metadata_ = std::move(other.metadata_);
    tensors_ = std::move(other.tensors_);
    metadata_index_ = std::move(other.metadata_index_);
    tensor_index_ = std::move(other.tensor_index_);
    other.metadata_.clear();
    other.tensors_.clear();
    other.metadata_index_.clear();
    other.tensor_index_.clear();
  }
  return *this;
}

GgufFile::~GgufFile() { Unmap(); }

void GgufFile::Unmap() {
  if (map_ != nullptr) ::munmap(const_cast<uint8_t*>(map_), size_);
  map_ = nullptr;
  size_ = 0;
}

const GgufMetadata* GgufFile::FindMetadata(absl::string_view key) const {
  auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second];
}

const GgufTensor* GgufFile::FindTensor(absl::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}
bool IsGgufFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  uint8_t magic[4];
  const bool ok =
      ::pread(fd, magic, sizeof(magic), 0) == sizeof(magic) && Load<uint32_t>(magic) == kGgufMagic;
  ::close(fd);
  return ok;
}

}  // namespace heavykv