"""Orders hack/ci/test.sh's cargo test jobs longest first, from the durations
the last run recorded, so the two (or N) parallel slots end close together
instead of one long job starting last.

    python3 hack/ci/job_order.py JOBS DURATIONS   # prints JOBS reordered
    python3 hack/ci/job_order.py --record DURATIONS < NEW  # keeps NEW's times

JOBS has one job a line, in the order test.sh lists them (real-component
targets first). DURATIONS has `SECONDS JOB` lines; it may be missing or
stale. A job it does not name (a new test target) goes first, in JOBS'
order, as the longest may be new; the rest follow, longest first, ties in
JOBS' order. Only the order changes: every job in JOBS is printed once."""
import sys


def read_durations(path):
    durations = {}
    try:
        with open(path) as f:
            for line in f:
                seconds, _, job = line.rstrip("\n").partition(" ")
                if seconds.isdigit() and job:
                    durations[job] = int(seconds)
    except FileNotFoundError:
        pass
    return durations


def order(jobs, durations):
    new = [job for job in jobs if job not in durations]
    known = [job for job in jobs if job in durations]
    known.sort(key=lambda job: -durations[job])  # stable: ties keep JOBS' order
    return new + known


def main(argv):
    if argv[:1] == ["--record"] and len(argv) == 2:
        recorded = read_durations(argv[1])
        recorded.update(read_durations("/dev/stdin"))
        with open(argv[1], "w") as f:
            for job, seconds in sorted(recorded.items()):
                print(seconds, job, file=f)
        return 0
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        jobs = [line.rstrip("\n") for line in f if line.strip()]
    for job in order(jobs, read_durations(argv[1])):
        print(job)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
