"""The fan-out plan of role artifact_cache: which node gets an artifact from where, and when.

The controller sends an artifact to a few seed nodes (round 0) unless a node already holds
it; from round 1 on, every node that holds it serves one node that does not, so the holders
double each round and the controller's share stays the seeds' copies whatever the cluster's
size. Each puller also gets alternates (other holders from earlier rounds) to try when its
source cannot serve it: a node that fails mid-fan-out costs only the nodes it was to serve,
and only the time of one more try, not their place in later rounds.
"""

CONTROLLER = "controller"


def fanout_plan(needing, holders=(), seeds=1, alternates=2, peers=True):
    """Plan the pulls of one artifact.

    needing: the nodes (names, in order) without a good copy.
    holders: the nodes with a good copy already (they serve from round 1).
    seeds: how many nodes the controller sends to when no node holds it.
    alternates: how many other holders each puller may fall back on.
    peers: False when the nodes cannot log in to each other: all from the controller.

    Returns {node: {"round": R, "source": NODE or "controller", "alternates": [NODE, ...]}}
    for every needing node, plus "rounds": the last round (0 when only the controller sends).
    """
    needing = [node for node in needing if node not in set(holders)]
    if int(seeds) < 1:
        raise ValueError(f"seeds must be at least 1, got {seeds}")
    if int(alternates) < 0:
        raise ValueError(f"alternates must be 0 or more, got {alternates}")
    plan = {}
    if not peers:
        for node in needing:
            plan[node] = {"round": 0, "source": CONTROLLER, "alternates": []}
        return {"nodes": plan, "rounds": 0}
    have = list(dict.fromkeys(holders))
    waiting = list(needing)
    if not have and waiting:
        first, waiting = waiting[: int(seeds)], waiting[int(seeds):]
        for node in first:
            plan[node] = {"round": 0, "source": CONTROLLER, "alternates": []}
        have = list(first)
    rounds = 0
    while waiting:
        rounds += 1
        batch, waiting = waiting[: len(have)], waiting[len(have):]
        for place, node in enumerate(batch):
            others = have[place + 1:] + have[:place]
            plan[node] = {"round": rounds, "source": have[place], "alternates": others[: int(alternates)]}
        have += batch
    return {"nodes": plan, "rounds": rounds}


def fanout_plans(pushes, seeds=1, alternates=2):
    """Plan the pulls of every artifact the nodes of a play need, in one go.

    pushes: one dict per node: host, entry (the controller cache path), sha256, holds (its copy
    matches), cluster (the SSH trust it is in, '' when none). Nodes pull only from nodes of
    their own cluster that need the same entry with the same sha256; nodes in no cluster get
    it from the controller. Dicts without an entry (nodes done with an earlier artifact) are
    left out.

    Returns {"nodes": {host: ...}, "rounds": R} as fanout_plan, R the largest of all groups.
    """
    def holds(push):  # a bool, or its text when the template gave one
        return str(push.get("holds")).lower() in ("true", "1", "yes")

    groups = {}
    for push in pushes:
        if not push or not push.get("entry"):
            continue
        key = (push["entry"], push["sha256"], push.get("cluster") or "")
        groups.setdefault(key, []).append(push)
    plans = {"nodes": {}, "rounds": 0}
    for (_, _, cluster), members in groups.items():
        plan = fanout_plan(
            [push["host"] for push in members if not holds(push)],
            [push["host"] for push in members if holds(push)],
            seeds, alternates, peers=bool(cluster),
        )
        plans["nodes"].update(plan["nodes"])
        plans["rounds"] = max(plans["rounds"], plan["rounds"])
    return plans


class FilterModule:
    """fanout_plan and fanout_plans: see their docstrings."""

    def filters(self):
        return {"fanout_plan": fanout_plan, "fanout_plans": fanout_plans}
