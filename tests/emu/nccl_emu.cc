/*
** nccl_emu.cc — NCCL for the emulated device (tests/emu/README.md): the multi-GPU path
** of engine/dist/nccl.c run on the CPU. Each rank is a process with an emulated GPU of
** its own; the transfers between them go by MPI, which the processes have already
** (tetra.dist.init), on a communicator of the group's members.
**
** A communicator: group rank 0's unique id names its MPI world rank and a serial; at
** ncclCommInitRank every other member sends that rank its own world rank, rank 0 sends
** the list back, and all make the group by MPI_Comm_create_group, ranks in NCCL's order.
**
** A transfer issued on a stream runs as a GPU would run it, in the stream's order: when
** the stream reaches it (the work it is ordered after, the compute stream's kernels
** through an event, has run; without that event it reads what was there before, all-ones
** NaN in a fresh buffer) its data is read and MPI's nonblocking exchange starts; the next
** operation on the stream waits for every peer's part (a gate of the emulated stream,
** cuda_emu.cc) and writes the result into the receiving buffer. A host wait that meets
** that gate blocks until it opens, running the process's other streams meanwhile; a query
** stops there. So a member's transfers on two groups go on side by side, as NCCL's on the
** groups' own streams (the ranks of tp 2 x pp 2 may start their tp and pp all-reduces in
** crossed orders), and a kernel on another stream that reads the result without waiting
** for the transfer's stream (tt_nccl_join's event) reads the old bytes, as on a GPU.
** Every member must issue a group's collectives in one order, as NCCL requires. Sends and
** receives of one ncclGroupStart/End go together. Inside a CUDA graph capture the whole
** transfer is recorded and blocks at each replay until every member has replayed it;
** with TT_EMU_SYNC=eager every transfer blocks when issued (crossed orders hang there).
**
** Reductions add in rank order (bf16 and f16 in f32, rounded once): every member gets
** the same bits, as with NCCL, though not NCCL's own (a ring rounds each partial sum).
** A send waits for its receive (MPI_Issend), as every NCCL send too large for its
** buffers does, whatever its size: a pipeline whose sends and receives wait for each
** other in turn hangs here as on GPUs. Not here: NCCL's timing; a group across streams;
** communicators split or shared between threads.
*/
/* (MPI's C interface alone: Open MPI's C++ bindings are in a library not linked here) */
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <nccl.h>

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cuda_emu.h"

extern "C" int tt_emu_on_device(const void *p, size_t bytes);
extern "C" void tt_emu_fault(const char *why);

struct ncclComm {
  MPI_Comm mpi = MPI_COMM_NULL;
  int rank = 0, size = 1;
  bool aborted = false;
};

namespace {

/* What ncclGetUniqueId writes into the id's bytes. */
struct Id {
  char magic[8];
  int root;           /* the maker's rank in MPI_COMM_WORLD */
  unsigned serial;    /* its count of ids made */
};
const char kMagic[8] = "tt-nccl";

ncclResult_t refuse(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
ncclResult_t refuse(ncclResult_t r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("nccl_emu: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return r;
}

size_t elem_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

/* Element i of n ranks' arrays (count each, back to back) reduced in rank order into
** out[i], through Acc: load converts an element to Acc, store back. */
template <typename T, typename Acc, typename Load, typename Store>
void reduce_as(const char *all, int n, size_t count, ncclRedOp_t op, char *out, Load load,
               Store store) {
  const T *x = (const T *)all;
  T *y = (T *)out;
  for (size_t i = 0; i < count; i++) {
    Acc a = load(x[i]);
    for (int r = 1; r < n; r++) {
      Acc b = load(x[(size_t)r * count + i]);
      switch (op) {
        case ncclMax: a = b > a ? b : a; break;
        case ncclMin: a = b < a ? b : a; break;
        case ncclProd: a = a * b; break;
        default: a = a + b; break;
      }
    }
    if (op == ncclAvg) a = a / (Acc)n;
    y[i] = store(a);
  }
}

template <typename T>
void reduce_plain(const char *all, int n, size_t count, ncclRedOp_t op, char *out) {
  reduce_as<T, T>(all, n, count, op, out, [](T v) { return v; }, [](T v) { return v; });
}

bool reduce(ncclDataType_t t, ncclRedOp_t op, const char *all, int n, size_t count, char *out) {
  switch (t) {
    case ncclFloat32: reduce_plain<float>(all, n, count, op, out); return true;
    case ncclFloat64: reduce_plain<double>(all, n, count, op, out); return true;
    case ncclInt32: reduce_plain<int32_t>(all, n, count, op, out); return true;
    case ncclUint32: reduce_plain<uint32_t>(all, n, count, op, out); return true;
    case ncclInt64: reduce_plain<int64_t>(all, n, count, op, out); return true;
    case ncclUint64: reduce_plain<uint64_t>(all, n, count, op, out); return true;
    case ncclInt8: reduce_plain<int8_t>(all, n, count, op, out); return true;
    case ncclUint8: reduce_plain<uint8_t>(all, n, count, op, out); return true;
    case ncclBfloat16:
      reduce_as<__nv_bfloat16, float>(all, n, count, op, out,
                                      [](__nv_bfloat16 v) { return __bfloat162float(v); },
                                      [](float v) { return __float2bfloat16_rn(v); });
      return true;
    case ncclFloat16:
      reduce_as<__half, float>(all, n, count, op, out, [](__half v) { return __half2float(v); },
                               [](float v) { return __float2half_rn(v); });
      return true;
    default: return false;   /* fp8: NCCL moves it, and so does this; no sums */
  }
}

/* One transfer of a group: what it reads from the device (src), what it writes there
** (dst), and how. */
struct Op {
  enum Kind { kSend, kRecv, kAllReduce, kReduceScatter, kAllGather, kBroadcast } kind;
  ncclComm *comm;
  cudaStream_t stream;
  const void *src;
  size_t src_bytes;
  void *dst;
  size_t dst_bytes;
  int peer;                   /* a send's or receive's peer, a broadcast's root */
  ncclDataType_t type;        /* for the reductions */
  ncclRedOp_t op;
  size_t count;               /* elements each member reduces */
};

int g_group_depth;
std::vector<Op> g_group;   /* issued inside ncclGroupStart/End */

bool mpi_ok(int rc, const char *call) {
  if (rc == MPI_SUCCESS) return true;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  refuse(ncclSystemError, "%s failed: %s", call, text);
  return false;
}

bool fits_int(size_t bytes) { return bytes <= (size_t)INT_MAX; }

/* A group in flight: its sources as read when it started, what MPI brings (a receive's bytes,
** every member's sources for a collective), its requests. */
struct Flight {
  std::vector<Op> ops;
  std::vector<std::vector<char>> in, got;
  std::vector<MPI_Request> reqs;
};

/* Reads the sources and starts the exchange. Nonblocking: a member's exchanges on two
** groups go on together, as NCCL's do on the groups' own streams (the ranks of a tp 2 x
** pp 2 layout may start their tp and pp all-reduces in crossed orders). */
bool post(Flight &f) {
  const size_t n = f.ops.size();
  f.in.assign(n, {});
  f.got.assign(n, {});
  {
    tt_emu::DeviceWork device;
    for (size_t i = 0; i < n; i++)
      if (f.ops[i].src_bytes) {
        f.in[i].resize(f.ops[i].src_bytes);
        memcpy(f.in[i].data(), f.ops[i].src, f.ops[i].src_bytes);
      }
  }
  for (size_t i = 0; i < n; i++) {
    const Op &o = f.ops[i];
    std::vector<char> &in = f.in[i], &got = f.got[i];
    MPI_Request r = MPI_REQUEST_NULL;
    int rc = MPI_SUCCESS;
    const char *call = "";
    switch (o.kind) {
      case Op::kSend:
        /* synchronous: done only once the receiver has posted its receive, as an NCCL
        ** send larger than its buffers waits for its receiver (MPI_Isend may buffer it) */
        call = "MPI_Issend";
        rc = MPI_Issend(in.data(), (int)in.size(), MPI_BYTE, o.peer, 0, o.comm->mpi, &r);
        break;
      case Op::kRecv:
        call = "MPI_Irecv";
        got.resize(o.dst_bytes);
        rc = MPI_Irecv(got.data(), (int)got.size(), MPI_BYTE, o.peer, 0, o.comm->mpi, &r);
        break;
      case Op::kBroadcast:
        call = "MPI_Ibcast";
        got = o.comm->rank == o.peer ? in : std::vector<char>(o.dst_bytes);
        rc = MPI_Ibcast(got.data(), (int)got.size(), MPI_BYTE, o.peer, o.comm->mpi, &r);
        break;
      default:   /* every member's source, reduced or kept when all have come */
        call = "MPI_Iallgather";
        got.resize(in.size() * (size_t)o.comm->size);
        if (!fits_int(got.size())) return refuse(ncclInvalidArgument, "a gather over 2 GiB"), false;
        rc = MPI_Iallgather(in.data(), (int)in.size(), MPI_BYTE, got.data(), (int)in.size(),
                            MPI_BYTE, o.comm->mpi, &r);
        break;
    }
    if (!mpi_ok(rc, call)) return false;
    f.reqs.push_back(r);
  }
  return true;
}

/* Waits for the exchange and writes each result into its device buffer. */
bool finish(Flight &f) {
  if (!f.reqs.empty() &&
      !mpi_ok(MPI_Waitall((int)f.reqs.size(), f.reqs.data(), MPI_STATUSES_IGNORE), "MPI_Waitall"))
    return false;
  tt_emu::DeviceWork device;
  for (size_t i = 0; i < f.ops.size(); i++) {
    const Op &o = f.ops[i];
    const std::vector<char> &got = f.got[i];
    const int members = o.comm->size;
    switch (o.kind) {
      case Op::kSend: break;
      case Op::kRecv: case Op::kBroadcast: case Op::kAllGather:
        memcpy(o.dst, got.data(), o.dst_bytes);
        break;
      case Op::kAllReduce:
        if (!reduce(o.type, o.op, got.data(), members, o.count, (char *)o.dst))
          return refuse(ncclInvalidArgument, "no reduction of type %d", (int)o.type), false;
        break;
      case Op::kReduceScatter: {
        std::vector<char> sum(o.src_bytes);
        if (!reduce(o.type, o.op, got.data(), members, o.count, sum.data()))
          return refuse(ncclInvalidArgument, "no reduction of type %d", (int)o.type), false;
        memcpy(o.dst, sum.data() + (size_t)o.comm->rank * o.dst_bytes, o.dst_bytes);
        break;
      }
    }
  }
  return true;
}

bool capturing(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(s, &st) == cudaSuccess && st != cudaStreamCaptureStatusNone;
}

/* TT_EMU_NCCL_TRACE=1: each transfer's issue, start and end on stderr (a hang's cause). */
const bool g_trace = [] {
  const char *v = getenv("TT_EMU_NCCL_TRACE");
  return v && *v && strcmp(v, "0") != 0;
}();

void trace(const char *what, const Flight &f) {
  if (!g_trace) return;
  static const char *kinds[] = {"send", "recv", "all_reduce", "reduce_scatter", "all_gather",
                                "broadcast"};
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  std::string line;
  for (const Op &o : f.ops) {
    char one[120];
    snprintf(one, sizeof one, " %s(group of %d, rank %d, peer %d, %zu+%zu B)", kinds[o.kind],
             o.comm->size, o.comm->rank, o.peer, o.src_bytes, o.dst_bytes);
    line += one;
  }
  fprintf(stderr, "nccl_emu: world rank %d: %s %p:%s\n", me, what, (const void *)&f,
          line.c_str());
}

/* Runs a group of transfers (one, outside ncclGroupStart/End). */
ncclResult_t run_group(std::vector<Op> ops) {
  if (ops.empty()) return ncclSuccess;
  for (const Op &o : ops) {
    if (o.comm->aborted) return refuse(ncclInvalidUsage, "a transfer on an aborted communicator");
    if (!fits_int(o.src_bytes) || !fits_int(o.dst_bytes))
      return refuse(ncclInvalidArgument, "a transfer of more than 2 GiB (MPI counts in int)");
    if ((o.src_bytes && !tt_emu_on_device(o.src, o.src_bytes)) ||
        (o.dst_bytes && !tt_emu_on_device(o.dst, o.dst_bytes)))
      return refuse(ncclInvalidArgument, "a buffer outside live device memory (%p, %p)", o.src,
                    o.dst);
    if (o.stream != ops[0].stream)
      return refuse(ncclInvalidUsage, "a group on two streams (the emulation takes one)");
  }
  auto f = std::make_shared<Flight>();
  f->ops = std::move(ops);
  cudaStream_t s = f->ops[0].stream;
  if (capturing(s)) {   /* the whole transfer, at each replay */
    tt_emu::submit(s, [f] {
      f->reqs.clear();
      if (!post(*f) || !finish(*f)) tt_emu_fault("an NCCL transfer replayed from a graph failed");
    });
    return ncclSuccess;
  }
  /* Started when the stream reaches it, after the work it is ordered after; its results
  ** written once every peer's part has come. */
  trace("issued", *f);
  tt_emu::submit(s, [f] {
    trace("started", *f);
    if (!post(*f)) tt_emu_fault("an NCCL transfer failed to start");
  });
  tt_emu::submit(s, [f] {
    trace("ended", *f);
    if (!finish(*f)) tt_emu_fault("an NCCL transfer failed");
  }, [f] {
    int done = 0;   /* (an error opens it: finish's wait reports it) */
    return f->reqs.empty() ||
           MPI_Testall((int)f->reqs.size(), f->reqs.data(), &done, MPI_STATUSES_IGNORE) !=
               MPI_SUCCESS ||
           done;
  });
  return ncclSuccess;
}

ncclResult_t issue(Op o) {
  if (g_group_depth > 0) {
    g_group.push_back(std::move(o));
    return ncclSuccess;
  }
  return run_group({std::move(o)});
}

bool check_comm(ncclComm_t c) { return c && c->mpi != MPI_COMM_NULL; }

}  // namespace

extern "C" {

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (emulated)";
    case ncclSystemError: return "unhandled system error (emulated: MPI failed)";
    case ncclInternalError: return "internal error (emulated)";
    case ncclInvalidArgument: return "invalid argument (emulated)";
    case ncclInvalidUsage: return "invalid usage (emulated)";
    case ncclRemoteError: return "remote process exited or there was a network error (emulated)";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  int up = 0;
  MPI_Initialized(&up);
  if (!up) return refuse(ncclInvalidUsage, "the emulated NCCL carries its transfers by MPI: "
                                           "MPI_Init first");
  static unsigned serial;
  Id mine;
  memcpy(mine.magic, kMagic, sizeof mine.magic);
  MPI_Comm_rank(MPI_COMM_WORLD, &mine.root);
  mine.serial = serial++;
  memset(id, 0, sizeof *id);
  memcpy(id->internal, &mine, sizeof mine);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
  Id id;
  memcpy(&id, commId.internal, sizeof id);
  if (memcmp(id.magic, kMagic, sizeof id.magic) != 0)
    return refuse(ncclInvalidArgument, "not a unique id of ncclGetUniqueId");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return refuse(ncclInvalidArgument, "rank %d of %d", rank, nranks);
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  if (rank == 0 && me != id.root)
    return refuse(ncclInvalidUsage, "rank 0 must be the process that made the unique id");
  /* (MPI_COMM_WORLD itself: the engine talks on its duplicate, so these tags are ours) */
  const int tag = 1000 + (int)(id.serial % 30000u);
  std::vector<int> members((size_t)nranks, -1);
  if (rank == 0) {
    members[0] = me;
    for (int i = 1; i < nranks; i++) {
      int pair[2];
      if (!mpi_ok(MPI_Recv(pair, 2, MPI_INT, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD,
                           MPI_STATUS_IGNORE), "MPI_Recv (ncclCommInitRank)"))
        return ncclSystemError;
      if (pair[0] <= 0 || pair[0] >= nranks || members[(size_t)pair[0]] >= 0)
        return refuse(ncclInvalidUsage, "two members claim rank %d", pair[0]);
      members[(size_t)pair[0]] = pair[1];
    }
    for (int i = 1; i < nranks; i++)
      if (!mpi_ok(MPI_Send(members.data(), nranks, MPI_INT, members[(size_t)i], tag,
                           MPI_COMM_WORLD), "MPI_Send (ncclCommInitRank)"))
        return ncclSystemError;
  } else {
    int pair[2] = {rank, me};
    if (!mpi_ok(MPI_Send(pair, 2, MPI_INT, id.root, tag, MPI_COMM_WORLD),
                "MPI_Send (ncclCommInitRank)") ||
        !mpi_ok(MPI_Recv(members.data(), nranks, MPI_INT, id.root, tag, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE), "MPI_Recv (ncclCommInitRank)"))
      return ncclSystemError;
  }
  MPI_Group world, group;
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  MPI_Group_incl(world, nranks, members.data(), &group);
  auto c = std::make_unique<ncclComm>();
  int rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, tag, &c->mpi);
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  if (!mpi_ok(rc, "MPI_Comm_create_group (ncclCommInitRank)")) return ncclSystemError;
  MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN);
  c->rank = rank;
  c->size = nranks;
  *comm = c.release();
  return ncclSuccess;
}

/* Abort may come from another thread (the engine's watchdog): it only marks the
** communicator, which the engine no longer uses, and leaves its MPI group behind. */
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm) __atomic_store_n(&comm->aborted, true, __ATOMIC_RELEASE);
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  int done = 0;
  MPI_Finalized(&done);
  if (!done && comm->mpi != MPI_COMM_NULL) MPI_Comm_free(&comm->mpi);
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  if (!comm) return ncclInvalidArgument;
  *asyncError = ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) {
  g_group_depth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
  if (g_group_depth == 0) return refuse(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--g_group_depth > 0) return ncclSuccess;
  std::vector<Op> ops;
  ops.swap(g_group);
  return run_group(std::move(ops));
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  const size_t es = elem_size(datatype);
  if (!check_comm(comm) || !es || peer < 0 || peer >= comm->size)
    return refuse(ncclInvalidArgument, "ncclSend: a bad communicator, type or peer %d", peer);
  return issue({Op::kSend, comm, stream, sendbuff, count * es, nullptr, 0, peer, datatype,
                ncclSum, count});
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  const size_t es = elem_size(datatype);
  if (!check_comm(comm) || !es || peer < 0 || peer >= comm->size)
    return refuse(ncclInvalidArgument, "ncclRecv: a bad communicator, type or peer %d", peer);
  return issue({Op::kRecv, comm, stream, nullptr, 0, recvbuff, count * es, peer, datatype,
                ncclSum, count});
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  const size_t es = elem_size(datatype);
  if (!check_comm(comm) || !es) return refuse(ncclInvalidArgument, "ncclAllReduce: bad arguments");
  return issue({Op::kAllReduce, comm, stream, sendbuff, count * es, recvbuff, count * es, 0,
                datatype, op, count});
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  const size_t es = elem_size(datatype);
  if (!check_comm(comm) || !es)
    return refuse(ncclInvalidArgument, "ncclReduceScatter: bad arguments");
  const size_t n = recvcount * (size_t)comm->size;
  return issue({Op::kReduceScatter, comm, stream, sendbuff, n * es, recvbuff, recvcount * es, 0,
                datatype, op, n});
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  const size_t es = elem_size(datatype);
  if (!check_comm(comm) || !es) return refuse(ncclInvalidArgument, "ncclAllGather: bad arguments");
  return issue({Op::kAllGather, comm, stream, sendbuff, sendcount * es, recvbuff,
                sendcount * es * (size_t)comm->size, 0, datatype, ncclSum, sendcount});
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  const size_t es = elem_size(datatype);
  if (!check_comm(comm) || !es || root < 0 || root >= comm->size)
    return refuse(ncclInvalidArgument, "ncclBroadcast: bad arguments (root %d)", root);
  const bool reads = comm->rank == root;   /* (only the root's send buffer is read) */
  return issue({Op::kBroadcast, comm, stream, reads ? sendbuff : nullptr, reads ? count * es : 0,
                recvbuff, count * es, root, datatype, ncclSum, count});
}

}  // extern "C"
