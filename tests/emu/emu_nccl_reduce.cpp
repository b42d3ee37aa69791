// emu_nccl_reduce.cpp: the arithmetic of the emulated NCCL's collectives
// (emu_nccl.h): the element types, a reduction in a ring's order, and every
// rank's output from every rank's input.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "emu_nccl.h"

namespace zf::emu::nccl {

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::all_reduce: return "ncclAllReduce";
    case Kind::reduce_scatter: return "ncclReduceScatter";
    case Kind::all_gather: return "ncclAllGather";
    case Kind::broadcast: return "ncclBroadcast";
  }
  return "?";
}

std::string Call::describe() const {
  return std::string(kind_name(kind)) + "(count " + std::to_string(count) + ", type " +
         std::to_string(int(type)) + ", op " + std::to_string(int(op)) + ", root " +
         std::to_string(root) + ")";
}

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

namespace {

bool is_float(ncclDataType_t t) { return t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16; }
bool is_signed(ncclDataType_t t) { return t == ncclInt8 || t == ncclInt32 || t == ncclInt64; }

// ------------------------------------------------------------ floats

double load_float(ncclDataType_t t, const void* p, size_t i) {
  if (t == ncclFloat32) return double(static_cast<const float*>(p)[i]);
  if (t == ncclFloat64) return static_cast<const double*>(p)[i];
  return double(__bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]));
}
void store_float(ncclDataType_t t, void* p, size_t i, double v) {
  if (t == ncclFloat32) static_cast<float*>(p)[i] = float(v);
  else if (t == ncclFloat64) static_cast<double*>(p)[i] = v;
  else static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(float(v));
}
// v as the type holds it (the rounding of one step of the ring). A sum of
// two bf16 values is exact in double, and a sum of two float32 values
// rounded to double and then to float32 is their float32 sum: so this is
// the type's own addition.
double round_to(ncclDataType_t t, double v) {
  if (t == ncclFloat32) return double(float(v));
  if (t == ncclBfloat16) return double(__bfloat162float(__float2bfloat16_rn(float(v))));
  return v;
}

// ------------------------------------------------------------ integers

// Element i as a 64-bit pattern: sign-extended for the signed types.
uint64_t load_int(ncclDataType_t t, const void* p, size_t i) {
  switch (t) {
    case ncclInt8: return uint64_t(int64_t(static_cast<const int8_t*>(p)[i]));
    case ncclUint8: return static_cast<const uint8_t*>(p)[i];
    case ncclInt32: return uint64_t(int64_t(static_cast<const int32_t*>(p)[i]));
    case ncclUint32: return static_cast<const uint32_t*>(p)[i];
    case ncclInt64: return uint64_t(static_cast<const int64_t*>(p)[i]);
    default: return static_cast<const uint64_t*>(p)[i];
  }
}
// Stores the low bits (the type's wrap-around).
void store_int(ncclDataType_t t, void* p, size_t i, uint64_t v) {
  switch (t) {
    case ncclInt8: case ncclUint8: static_cast<uint8_t*>(p)[i] = uint8_t(v); break;
    case ncclInt32: case ncclUint32: static_cast<uint32_t*>(p)[i] = uint32_t(v); break;
    default: static_cast<uint64_t*>(p)[i] = v; break;
  }
}
// v as the type holds it, back as a 64-bit pattern.
uint64_t wrap(ncclDataType_t t, uint64_t v) {
  uint64_t x = 0;
  store_int(t, &x, 0, v);
  return load_int(t, &x, 0);
}
bool less(ncclDataType_t t, uint64_t a, uint64_t b) {
  return is_signed(t) ? int64_t(a) < int64_t(b) : a < b;
}

// out[i] = the reduction over ranks q of in[q][offset + i], in ring order.
void reduce(ncclDataType_t t, ncclRedOp_t op, const std::vector<const void*>& in, size_t offset,
            size_t count, void* out) {
  const int n = int(in.size());
  const double scale = round_to(t, 1.0 / n);
  for (size_t i = 0; i < count; i++) {
    const int first = int(((offset + i) / kChunk) % size_t(n));
    if (is_float(t)) {
      double acc = 0;
      for (int k = 0; k < n; k++) {
        double x = load_float(t, in[size_t((first + k) % n)], offset + i);
        if (op == ncclAvg) x = round_to(t, x * scale);
        if (k == 0) acc = x;
        else if (op == ncclProd) acc = round_to(t, acc * x);
        else if (op == ncclMax) acc = std::max(acc, x);
        else if (op == ncclMin) acc = std::min(acc, x);
        else acc = round_to(t, acc + x);
      }
      store_float(t, out, i, acc);
      continue;
    }
    uint64_t acc = 0;
    for (int k = 0; k < n; k++) {
      const uint64_t x = load_int(t, in[size_t((first + k) % n)], offset + i);
      if (k == 0) acc = x;
      else if (op == ncclProd) acc *= x;
      else if (op == ncclMax) acc = less(t, acc, x) ? x : acc;
      else if (op == ncclMin) acc = less(t, x, acc) ? x : acc;
      else acc += x;
    }
    if (op == ncclAvg) {
      acc = wrap(t, acc);
      acc = is_signed(t) ? uint64_t(int64_t(acc) / n) : acc / uint64_t(n);
    }
    store_int(t, out, i, acc);
  }
}

}  // namespace

void compute(const std::vector<Call>& calls) {
  const Call& c0 = calls[0];
  const int n = int(calls.size());
  const size_t bytes = c0.count * type_size(c0.type);
  std::vector<const void*> in;
  for (const Call& c : calls) in.push_back(c.send);
  std::vector<std::vector<char>> out(calls.size());  // all outputs first: inputs may be outputs
  switch (c0.kind) {
    case Kind::all_reduce:
      out[0].resize(bytes);
      reduce(c0.type, c0.op, in, 0, c0.count, out[0].data());
      for (int r = 1; r < n; r++) out[size_t(r)] = out[0];
      break;
    case Kind::reduce_scatter:
      for (int r = 0; r < n; r++) {
        out[size_t(r)].resize(bytes);
        reduce(c0.type, c0.op, in, size_t(r) * c0.count, c0.count, out[size_t(r)].data());
      }
      break;
    case Kind::all_gather:
      for (int r = 0; r < n; r++) {
        out[size_t(r)].resize(size_t(n) * bytes);
        for (int q = 0; q < n; q++)
          std::memcpy(out[size_t(r)].data() + size_t(q) * bytes, calls[size_t(q)].send, bytes);
      }
      break;
    case Kind::broadcast: {
      const char* root = static_cast<const char*>(calls[size_t(c0.root)].send);
      for (int r = 0; r < n; r++) out[size_t(r)].assign(root, root + bytes);
      break;
    }
  }
  for (int r = 0; r < n; r++)
    std::memcpy(calls[size_t(r)].recv, out[size_t(r)].data(), out[size_t(r)].size());
}

}  // namespace zf::emu::nccl
