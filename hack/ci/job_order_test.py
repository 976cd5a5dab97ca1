"""Checks hack/ci/job_order.py: `python3 -m unittest discover -s hack/ci -p '*_test.py'`."""
import os
import tempfile
import unittest

import job_order


class OrderTest(unittest.TestCase):
    def test_new_jobs_first_then_longest_first_ties_in_listed_order(self):
        jobs = ["a", "b", "c", "d", "new"]
        durations = {"a": 10, "b": 300, "c": 10, "d": 45}
        self.assertEqual(job_order.order(jobs, durations), ["new", "b", "d", "a", "c"])

    def test_no_record_keeps_the_listed_order(self):
        self.assertEqual(job_order.order(["x", "y"], {}), ["x", "y"])

    def test_a_job_no_longer_listed_is_not_run(self):
        self.assertEqual(job_order.order(["x"], {"gone": 500, "x": 1}), ["x"])

    def test_the_record_keeps_old_times_and_takes_new_ones(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "durations")
            with open(path, "w") as f:
                f.write("30 -p a --test x\n12 -p b --test y\nnot a line\n")
            with open(os.path.join(d, "new"), "w") as f:
                f.write("40 -p a --test x\n")
            with open(os.path.join(d, "new")) as new:
                stdin = os.dup(0)
                os.dup2(new.fileno(), 0)
                try:
                    job_order.main(["--record", path])
                finally:
                    os.dup2(stdin, 0)
            self.assertEqual(
                job_order.read_durations(path), {"-p a --test x": 40, "-p b --test y": 12}
            )


if __name__ == "__main__":
    unittest.main()
