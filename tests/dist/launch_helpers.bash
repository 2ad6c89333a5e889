# Sourced by the tests of tetra launch (launch_chaos.sh, checkpoint_async.sh) after
# prelude.bash.

# The pids of process $1's children, one per line.
children_of() {
  ps -o pid= --ppid "$1" | awk "{print \$1}"
}

# The pid of the job tetra launch (pid $1) runs now: its child, mpirun.
job_of() {
  children_of "$1" | head -n 1
}

# The pids of a job's ranks: the children of mpirun, itself the child of tetra launch
# (pid $1).
ranks_of() {
  local mp
  mp=$(job_of "$1")
  [ -n "$mp" ] && children_of "$mp"
}

# chaos LAUNCH_PID CHECKPOINT_DIR KILLS EVERY_NTH: KILLS SIGKILLs of a random one of the
# job's 4 ranks. Before each kill the job must have written a checkpoint since the last
# one (so every restart makes progress, however slowly a busy machine starts the ranks),
# then a random 0-0.3 s passes; every EVERY_NTH-th kill also waits for a checkpoint being
# written (a .tmp.step_* directory in CHECKPOINT_DIR). Each kill goes to a new start of
# the job (a new mpirun): a checkpoint published between reading `latest` and the kill
# would otherwise let the next kill hit the dying job's ranks, two kills for one
# restart. Sets chaos_during_save (kills that found a save in progress) and chaos_done
# (kills made).
chaos() {
  local launch="$1" ck="$2" kills="$3" nth="$4" k tries target pids seen="" now
  local job killed="" saving
  chaos_during_save=0 chaos_done=0
  for ((k = 1; k <= kills; k++)); do
    target=""
    for ((tries = 0; tries < 12000; tries++)); do   # up to ~60 s for the job to get on
      kill -0 "$launch" 2>/dev/null || break
      now=$(cat "$ck/latest" 2>/dev/null)
      if [ -n "$now" ] && [ "$now" != "$seen" ]; then
        sleep "0.$((RANDOM % 4))"
        break
      fi
      sleep 0.005
    done
    for ((tries = 0; tries < 12000; tries++)); do
      kill -0 "$launch" 2>/dev/null || break
      job=$(job_of "$launch")
      pids=()
      [ -n "$job" ] && mapfile -t pids < <(children_of "$job")
      if [ -n "$job" ] && [ "$job" != "$killed" ] && [ "${#pids[@]}" -eq 4 ]; then
        if [ $((k % nth)) -eq 0 ] && ! compgen -G "$ck/.tmp.step_*" >/dev/null; then
          sleep 0.002; continue
        fi
        target="${pids[$((RANDOM % 4))]}"
        seen=$(cat "$ck/latest" 2>/dev/null)
        saving=0
        compgen -G "$ck/.tmp.step_*" >/dev/null && saving=1
        kill -KILL "$target" 2>/dev/null || { target=""; sleep 0.005; continue; }
        chaos_during_save=$((chaos_during_save + saving))
        killed=$job
        break
      fi
      sleep 0.005
    done
    [ -n "$target" ] || return 1
    chaos_done=$k
  done
}

# same_records REF GOT RESTARTS: GOT's (step, loss, grad_norm) records equal REF's and
# its `restarts` field ends at RESTARTS.
same_records() {
  "${PYTHON:-python3}" - "$1" "$2" "$3" <<'PY'
import json, sys
ref = [json.loads(l) for l in open(sys.argv[1])]
got = [json.loads(l) for l in open(sys.argv[2])]
want_restarts = int(sys.argv[3])
key = lambda rs: [(r["step"], r["loss"], r["grad_norm"]) for r in rs]
if key(got) != key(ref):
    diff = [(a, b) for a, b in zip(key(ref), key(got)) if a != b][:3]
    print(f"FAIL: {sys.argv[2]}: {len(got)} records, first differences (ref, got): {diff}")
    sys.exit(1)
if max(r.get("restarts", -1) for r in got) != want_restarts or got[-1]["restarts"] != want_restarts:
    print(f"FAIL: the records' restarts field does not reach {want_restarts}")
    sys.exit(1)
print(f"{sys.argv[2]}: {len(got)} steps equal the uninterrupted run's bit for bit")
PY
}
