"""The slurm role's slurm_accounting module (roles/slurm/library): sacctmgr's output read back, and the
commands that make the accounting database what the inventory declares, on recorded output of
Slurm 22.05's sacctmgr (tests/fixtures/recorded/sacctmgr-*.txt)."""

from __future__ import annotations

import importlib.util
import re

import pytest

from tests.conftest import PLUGINS, ROOT

RECORDED = ROOT / "tests" / "fixtures" / "recorded"
_spec = importlib.util.spec_from_file_location("slurm_accounting", PLUGINS / "modules" / "slurm_accounting.py")
assert _spec is not None and _spec.loader is not None
acct = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(acct)

CLUSTER = "lab_a"
TEAM_QOS = {"name": "team-gpu", "max_tres_per_user": "gres/gpu=1", "max_wall": "10", "flags": ["DenyOnLimit"],
            "priority": 10}
TEAM = {"name": "team", "fairshare": 2, "qos": ["normal", "team-gpu"], "default_qos": "team-gpu",
        "description": "the test team"}
ALICE = {"name": "alice", "accounts": ["team"]}


def _held(name: str) -> dict[str, list[dict[str, str]]]:
    """A database as sacctmgr showed it: recorded/sacctmgr-NAME-{qos,account,association,user}.txt."""
    formats = {"qos": acct.QOS_FORMAT, "account": acct.ACCOUNT_FORMAT, "association": acct.ASSOC_FORMAT,
               "user": acct.USER_FORMAT}
    return {entity: acct.parse_rows((RECORDED / f"sacctmgr-{name}-{entity}.txt").read_text(), fields)
            for entity, fields in formats.items()}


def _plan(held: dict, qos=(), accounts=(), users=()) -> list[str]:
    commands = acct.plan(CLUSTER, list(qos), list(accounts), list(users),
                         held["qos"], held["account"], held["association"], held["user"])
    return [" ".join(command) for command in commands]


def test_the_show_commands_ask_for_the_fields_the_parser_reads_in_their_order():
    command = acct.show_command("association", acct.ASSOC_FORMAT, CLUSTER)
    assert command == ["sacctmgr", "--immediate", "--noheader", "--parsable2", "show", "association",
                       "where", f"cluster={CLUSTER}", "format=Account,User,ParentName,Fairshare,QOS,DefaultQOS"]
    rows = _held("fresh")["association"]
    assert {"Account": "root", "User": "root", "ParentName": "", "Fairshare": "1", "QOS": "normal",
            "DefaultQOS": ""} in rows


def test_a_fresh_database_gets_the_qos_then_the_account_then_the_user():
    assert _plan(_held("fresh"), [TEAM_QOS], [TEAM], [ALICE]) == [
        "add qos team-gpu Priority=10 MaxWall=10 MaxTRESPerUser=gres/gpu=1 Flags=DenyOnLimit",
        f"add account team cluster={CLUSTER} parent=root Description=the test team Fairshare=2 QOS=normal,team-gpu "
        "DefaultQOS=team-gpu",
        f"add user alice account=team cluster={CLUSTER} defaultaccount=team",
    ]


def test_what_sacctmgr_shows_after_applying_it_is_no_difference():
    # The database after the commands above: Slurm writes 10 minutes as 00:10:00, and its lists its own way.
    assert _plan(_held("team"), [TEAM_QOS], [TEAM], [ALICE]) == []
    assert _plan(_held("team"), [{**TEAM_QOS, "max_wall": "00:10:00"}], [{**TEAM, "qos": ["team-gpu", "normal"]}]) == []


def test_only_the_settings_that_differ_are_set_and_settings_not_named_are_left_alone():
    held = _held("team")
    assert _plan(held, [{"name": "team-gpu", "max_tres_per_user": "gres/gpu=2", "max_wall": "10"}]) == [
        "modify qos where name=team-gpu set MaxTRESPerUser=gres/gpu=2"]
    assert _plan(held, [], [{"name": "team", "fairshare": 3}]) == [
        f"modify account where name=team cluster={CLUSTER} set Fairshare=3"]
    assert _plan(held, [], [], [{"name": "alice", "accounts": ["team"], "fairshare": 5}]) == [
        f"modify user where name=alice account=team cluster={CLUSTER} set Fairshare=5"]
    # -1 is no limit: clears a limit the database has, and equals one it does not.
    assert _plan(held, [{"name": "team-gpu", "max_wall": -1}]) == ["modify qos where name=team-gpu set MaxWall=-1"]
    assert _plan(held, [{"name": "normal", "max_wall": -1}]) == []


def test_an_existing_user_joins_another_account_and_keeps_its_default_unless_one_is_named():
    held = _held("team")
    assert _plan(held, [], [], [{"name": "root", "accounts": ["team"]}]) == [
        f"add user root account=team cluster={CLUSTER}"]
    assert _plan(held, [], [], [{"name": "root", "accounts": ["team"], "default_account": "team"}]) == [
        f"add user root account=team cluster={CLUSTER}", "modify user where name=root set defaultaccount=team"]


def test_an_account_s_parent_is_added_before_it_and_moved_to_when_it_changes():
    held = _held("fresh")
    child, parent = {"name": "vision", "parent": "research"}, {"name": "research"}
    assert [line.split(" cluster=")[0] for line in _plan(held, [], [child, parent])] == [
        "add account research", "add account vision"]
    assert _plan(_held("team"), [], [{"name": "team", "parent": "research"}, parent]) == [
        f"add account research cluster={CLUSTER} parent=root",
        f"modify account where name=team cluster={CLUSTER} set parent=research"]


def test_only_what_says_absent_is_removed_users_first_and_what_is_not_there_is_left():
    held = _held("team")
    gone = {"state": "absent"}
    assert _plan(held, [{"name": "team-gpu", **gone}], [{"name": "team", **gone}], [{"name": "alice", **gone}]) == [
        # Users and accounts are the cluster's own (a slurmdbd may serve several clusters); QOS are the database's.
        "delete user where name=alice cluster=lab_a", "delete account where name=team cluster=lab_a",
        "delete qos where name=team-gpu"]
    assert _plan(_held("fresh"), [{"name": "team-gpu", **gone}], [{"name": "team", **gone}],
                 [{"name": "alice", **gone}]) == []
    assert _plan(held) == []  # nothing declared: nothing removed


@pytest.mark.parametrize(("qos", "accounts", "users", "said"), [
    ([{"name": "q", "max_wal": "10"}], [], [], "QOS q: unknown setting(s) max_wal"),
    ([{"name": "q", "max_wall": "ten"}], [], [], "'ten' is not a Slurm time"),
    ([{"name": "q", "max_tres_per_user": "gpu:2"}], [], [], "'gpu:2' is not a TRES list"),
    ([], [{"name": "a", "qos": ["normal"], "default_qos": "gpu"}], [], "account a: default_qos gpu is not one of its qos"),
    ([], [], [{"name": "u", "accounts": []}], "user u: accounts is empty"),
    ([], [], [{"name": "u", "accounts": ["a"], "default_account": "b"}], "user u: default_account b is not one"),
    ([], [{"name": "a"}, {"name": "A"}], [], "account A is declared twice"),
    ([], [{"name": "a", "parent": "b"}, {"name": "b", "parent": "a"}], [], "go round in a circle"),
    ([{"name": "q", "state": "gone"}], [], [], "state is present or absent"),
    ([], [{"description": "no name"}], [], "an entry of slurm_accounts has no name"),
])
def test_what_sacctmgr_would_refuse_halfway_is_refused_before_anything_runs(qos, accounts, users, said):
    with pytest.raises(acct.Refused) as caught:
        _plan(_held("fresh"), qos, accounts, users)
    assert said in str(caught.value)


@pytest.mark.parametrize(("text", "seconds"), [
    ("10", 600), ("10:30", 630), ("1:00:00", 3600), ("24:00:00", 86400), ("1-00:00:00", 86400), ("2-3", 2 * 86400 + 3 * 3600),
    ("1-02:03", 86400 + 2 * 3600 + 180), ("", None), ("-1", None), ("UNLIMITED", None), ("INFINITE", None),
])
def test_slurm_times_in_each_of_their_forms(text, seconds):
    assert acct.seconds(text) == seconds


@pytest.mark.parametrize(("qos", "accounts", "users", "said"), [
    ([{"name": "a,b"}], [], [], "QOS a,b: name 'a,b' is not a Slurm name"),
    ([], [{"name": "lab", "qos": ["normal", "x y"]}], [], "account lab: qos 'x y' is not a Slurm name"),
    ([], [{"name": "lab", "parent": "root=1"}], [], "account lab: parent 'root=1' is not a Slurm name"),
    ([], [], [{"name": "ana bob", "accounts": ["lab"]}], "user ana bob: name 'ana bob' is not a Slurm name"),
    ([], [], [{"name": "ana", "accounts": ["lab", "a,b"]}], "user ana: accounts 'a,b' is not a Slurm name"),
])
def test_names_sacctmgr_would_split_or_misread_are_refused(qos, accounts, users, said):
    with pytest.raises(acct.Refused, match=re.escape(said)):
        acct.check(qos, accounts, users)
