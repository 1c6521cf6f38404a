"""Reads the result table of a benchmark launch: railyard-perf's (size count type redop root time
algbw busbw ..., out-of-place first) or bench/mpi_allreduce.c's (size time algbw busbw). Used by
the summaries of bench/sidebyside.sh and bench/scale.sh."""


def time_per_op(path: str, railyard: bool) -> dict:
    """{size in bytes: time per operation in us} from the file's numeric rows; `railyard` says
    which tool's columns they are."""
    rows = {}
    with open(path) as f:
        for line in f:
            fields = line.split()
            if not fields or not fields[0].isdigit():
                continue
            rows[int(fields[0])] = float(fields[5] if railyard else fields[1])
    return rows
