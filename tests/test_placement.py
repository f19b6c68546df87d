"""Nested placement's pure parts (controller/backends/placement.py) and how a policy plans
when CPU weights do not reach every job (JobView.levers)."""
from __future__ import annotations

from pathlib import Path

import pytest

from controller.backends.placement import UNIFIED, cgroups_of, detect_scheduler, find_job_groups, parent_below
from controller.policies import make_policy
from controller.policies.base import JobView, NodeResources, plan_by_quota


@pytest.mark.parametrize(("paths", "scheduler"), [
    (["/slurm_node1/uid_1000/job_42/step_batch/task_0"], "slurm"),
    (["/slurm/uid_0/job_7/step_0"], "slurm"),
    (["/system.slice/slurmstepd.scope/job_9/step_batch/user/task_0"], "slurm"),
    (["/system.slice/slurmd.service", "/slurm/uid_0/job_3/step_batch"], "slurm"),
    (["/kubepods/burstable/pod1234/abcd"], "kubernetes"),
    (["/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12.slice/cri-containerd-ab.scope"],
     "kubernetes"),
    (["/system.slice/train.service"], "systemd"),
    (["/user.slice/user-0.slice/session-3.scope"], "systemd"),
    (["/", "/"], "none"),
    (["/process_api/8beeb75b"], "none"),
])
def test_the_scheduler_is_named_from_the_cgroup_paths(paths: list[str], scheduler: str) -> None:
    assert detect_scheduler(paths) == scheduler


def test_a_process_already_in_a_job_group_is_placed_beside_it_not_inside() -> None:
    assert parent_below("/", "adloader") == "/"
    assert parent_below("/kubepods/burstable/pod1/c1", "adloader") == "/kubepods/burstable/pod1/c1"
    assert parent_below("/kubepods/burstable/pod1/c1/adloader/j1", "adloader") == "/kubepods/burstable/pod1/c1"


def test_proc_cgroup_is_read_per_hierarchy(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "cgroup").write_text(
        "9:name=systemd:/user.slice/session-1.scope\n3:cpu,cpuacct:/slurm/uid_0/job_1\n0::/\n"
    )
    assert cgroups_of(7, tmp_path) == {
        "name=systemd": "/user.slice/session-1.scope", "cpu": "/slurm/uid_0/job_1", "cpuacct": "/slurm/uid_0/job_1",
        UNIFIED: "/",
    }
    assert cgroups_of(8, tmp_path) == {}


def test_job_groups_are_found_anywhere_in_a_hierarchy(tmp_path: Path) -> None:
    for path in ("adloader/j1", "kubepods/burstable/pod1/c1/adloader/j2", "kubepods/burstable/pod1/c1/adloader/j2/sub",
                 "system.slice/x.service/adloader/j3", "adloader-other/j4"):
        (tmp_path / path).mkdir(parents=True)
    found = find_job_groups(tmp_path, "adloader")
    assert found == {
        "j1": tmp_path / "adloader/j1",
        "j2": tmp_path / "kubepods/burstable/pod1/c1/adloader/j2",
        "j3": tmp_path / "system.slice/x.service/adloader/j3",
    }


def _jobs(levers: frozenset[str] | None) -> list[JobView]:
    return [JobView(job_id=f"j{i}", name=f"job-{i}", levers=levers) for i in range(2)]


def test_quotas_carry_the_plan_where_weights_do_not_reach_every_job() -> None:
    node = NodeResources(cpus=(0, 1))
    everywhere = frozenset({"cpu_quota", "cpu_weight", "cpuset", "read_bps"})
    apart = everywhere - {"cpu_weight"}
    assert not plan_by_quota(_jobs(None)) and not plan_by_quota(_jobs(everywhere))
    assert plan_by_quota(_jobs(apart))
    assert not plan_by_quota(_jobs(frozenset({"cpuset"}))), "no quota either (affinity): nothing to plan on"

    siblings = make_policy("adaptive").allocate(node, _jobs(everywhere))
    assert all(a.cpu_weight is not None and a.cores is None for a in siblings.values())
    apart_plan = make_policy("adaptive").allocate(node, _jobs(apart))
    assert all(a.cpu_weight is None and a.cores is not None for a in apart_plan.values())
    assert sum(a.cores for a in apart_plan.values() if a.cores) == pytest.approx(node.cores)


def test_a_job_no_cpu_lever_acts_on_is_planned_no_weight_and_the_others_keep_theirs() -> None:
    """A job left in a cgroup given no ``cpu`` (its scheduler does not delegate it): nothing
    would apply a weight or quota to it, so the decision (and its log) names none, and the jobs
    whose CPU is controlled still share one parent: weights for them, not quotas."""
    everywhere = frozenset({"cpu_quota", "cpu_weight", "cpuset", "read_bps"})
    jobs = [*_jobs(everywhere), JobView(job_id="j-memory-only", name="pinned", levers=frozenset())]
    assert not plan_by_quota(jobs)
    plan = make_policy("adaptive").allocate(NodeResources(cpus=(0, 1)), jobs)
    assert plan["j-memory-only"].cpu_weight is None and plan["j-memory-only"].cores is None
    assert plan["j-memory-only"].workers is not None
    assert all(plan[f"j{i}"].cpu_weight is not None and plan[f"j{i}"].cores is None for i in range(2))
    affinity = make_policy("adaptive").allocate(NodeResources(cpus=(0, 1)), _jobs(frozenset({"cpuset"})))
    assert all(a.cpu_weight is None and a.cores is None for a in affinity.values()), "the affinity backend"
