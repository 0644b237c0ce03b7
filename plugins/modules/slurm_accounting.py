#!/usr/bin/python
"""Ansible module: Slurm's QOS, accounts and users as the inventory declares them, by sacctmgr.

It reads what the accounting database holds (`sacctmgr --noheader --parsable2 show ...`), works
out the sacctmgr commands that make it what the inventory says, and runs them (none in check
mode). Only what an entry names is compared and set: a setting the inventory leaves out is left
as the database has it, and nothing the inventory does not name is removed; an entry with
`state: absent` is removed. The parsers and the planner are pure functions, tested on recorded
output (tests/unit/plugins/modules/test_slurm_accounting.py); the role runs it on the controller.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: slurm_accounting
short_description: Make Slurm's QOS, accounts and users what the inventory declares.
description:
  - Compares the declared QOS, accounts and users with sacctmgr's and adds, modifies or removes
    only where they differ. Settings an entry does not name are left alone; entries are removed
    only where they say state absent.
options:
  cluster:
    description: Slurm's ClusterName, whose associations these are.
    type: str
    required: true
  qos:
    description: QOS (name; priority, max_wall, max_tres_per_user, max_tres_per_job, max_jobs_per_user, flags,
      description; state).
    type: list
    elements: dict
    default: []
  accounts:
    description: Accounts (name; description, organization, parent, fairshare, qos, default_qos; state).
    type: list
    elements: dict
    default: []
  users:
    description: Users (name; accounts, default_account, fairshare, qos, default_qos; state).
    type: list
    elements: dict
    default: []
  validate_only:
    description: Only check the entries (names, settings, values), as the role's preflight does
      before anything changes; sacctmgr is not asked.
    type: bool
    default: false
author: pycli
"""

RETURN = r"""
commands:
  description: The sacctmgr command lines run (in check mode, the ones that would be).
  returned: always
  type: list
"""

# Ansible's module layout: the documentation strings come before the imports.
import re  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

SACCTMGR = ["sacctmgr", "--immediate", "--noheader", "--parsable2"]

# A QOS: inventory key -> (sacctmgr's setting, its `show qos` format field, kind).
QOS_FIELDS = {
    "priority": ("Priority", "Priority", "number"),
    "max_wall": ("MaxWall", "MaxWall", "time"),
    "max_tres_per_user": ("MaxTRESPerUser", "MaxTRESPU", "tres"),
    "max_tres_per_job": ("MaxTRESPerJob", "MaxTRES", "tres"),
    "max_jobs_per_user": ("MaxJobsPerUser", "MaxJobsPU", "number"),
    "flags": ("Flags", "Flags", "set"),
    "description": ("Description", "Descr", "text"),
}
# An association (an account's, or a user's in one account): the settings both take.
ASSOC_FIELDS = {
    "fairshare": ("Fairshare", "Fairshare", "text"),
    "qos": ("QOS", "QOS", "set"),
    "default_qos": ("DefaultQOS", "DefaultQOS", "text"),
}
ACCOUNT_FIELDS = {
    "description": ("Description", "Descr", "text"),
    "organization": ("Organization", "Org", "text"),
}
ROOT_ACCOUNT = "root"
UNLIMITED = "-1"

QOS_FORMAT = ["Name"] + [field for _, field, _ in QOS_FIELDS.values()]
ACCOUNT_FORMAT = ["Account"] + [field for _, field, _ in ACCOUNT_FIELDS.values()]
ASSOC_FORMAT = ["Account", "User", "ParentName"] + [field for _, field, _ in ASSOC_FIELDS.values()]
USER_FORMAT = ["User", "DefaultAccount"]


class Refused(ValueError):
    """An inventory entry that cannot be applied, said in one line."""


def show_command(entity: str, fields: list[str], cluster: str | None = None) -> list[str]:
    where = ["where", f"cluster={cluster}"] if cluster else []
    return SACCTMGR + ["show", entity, *where, "format=" + ",".join(fields)]


def parse_rows(stdout: str, fields: list[str]) -> list[dict[str, str]]:
    """`sacctmgr -nP show ... format=...` as one dict per line (fields in the format's order)."""
    rows = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        values = line.split("|")
        rows.append({field: value.strip() for field, value in zip(fields, values + [""] * len(fields), strict=False)})
    return rows


def seconds(value: str) -> int | None:
    """A Slurm time ([days-]hours:minutes:seconds, minutes, minutes:seconds, days-hours...) in
    seconds; None for no limit (empty, -1, UNLIMITED, INFINITE)."""
    text = str(value).strip()
    if text in ("", UNLIMITED, "UNLIMITED", "INFINITE", "Partition_Limit"):
        return None
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if not match:
        raise Refused(f"{value!r} is not a Slurm time ([days-]hours:minutes:seconds, or minutes)")
    days, first, second, third = match.groups()
    if days is not None:  # days-hours[:minutes[:seconds]]
        parts = [int(first), int(second or 0), int(third or 0)]
        return int(days) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]
    if third is not None:  # hours:minutes:seconds
        return int(first) * 3600 + int(second) * 60 + int(third)
    if second is not None:  # minutes:seconds
        return int(first) * 60 + int(second)
    return int(first) * 60  # minutes


def tres(value: str) -> dict[str, str]:
    """A TRES list (cpu=4,gres/gpu=2) as a mapping; a count of -1 means no limit, left out."""
    found = {}
    for item in str(value).split(","):
        if not item.strip():
            continue
        name, sep, count = item.strip().partition("=")
        if not sep:
            raise Refused(f"{value!r} is not a TRES list (NAME=COUNT,...; for example gres/gpu=8)")
        if count.strip() != UNLIMITED:
            found[name.strip().lower()] = count.strip()
    return found


def words(value: object) -> frozenset[str]:
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    return frozenset(str(item).strip() for item in items if str(item).strip() and str(item).strip() != UNLIMITED)


def same(kind: str, declared: object, held: str) -> bool:
    if kind == "time":
        return seconds(str(declared)) == seconds(held)
    if kind == "tres":
        return tres(str(declared)) == tres(held)
    if kind == "set":
        return {w.lower() for w in words(declared)} == {w.lower() for w in words(held)}
    if kind == "number":
        return (held.strip() or UNLIMITED) == str(declared).strip()
    return str(declared).strip() == held.strip()


def setting(kind: str, name: str, declared: object) -> str:
    if kind == "set":
        return f"{name}={','.join(sorted(words(declared))) or UNLIMITED}"
    return f"{name}={declared}"


def settings(fields: dict, entry: dict, held: dict[str, str] | None) -> list[str]:
    """The NAME=VALUE settings of the entry's keys that differ from what is held (all of them when nothing is)."""
    out = []
    for key, (name, field, kind) in fields.items():
        if entry.get(key) is None:
            continue
        if held is None or not same(kind, entry[key], held.get(field, "")):
            out.append(setting(kind, name, entry[key]))
    return out


def present(entries: list[dict]) -> list[dict]:
    return [entry for entry in entries if entry.get("state", "present") == "present"]


def absent(entries: list[dict]) -> list[dict]:
    return [entry for entry in entries if entry.get("state", "present") == "absent"]


# A QOS's or an account's name as sacctmgr takes it whole: a comma would make two, a space or '='
# another word of its command line. A user's is a Linux user name.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*[$]?")
# The settings of an entry that name other entries.
NAME_LISTS = ("qos", "default_qos", "parent", "accounts", "default_account")


def _names(kind: str, name: str, named: dict[str, list[str]]) -> None:
    for key, values in named.items():
        pattern = USER_NAME if kind == "user" and key == "name" else NAME
        for value in values:
            if not pattern.fullmatch(value):
                raise Refused(f"{kind} {name}: {key} {value!r} is not a Slurm name (letters, digits, '_', '.', '-')")


def check(qos: list[dict], accounts: list[dict], users: list[dict]) -> None:
    """Refuse what sacctmgr would refuse halfway (or take for something else), before anything runs."""
    for kind, entries in (("QOS", qos), ("account", accounts), ("user", users)):
        seen = set()
        for entry in entries:
            name = str(entry.get("name") or "").strip()
            if not name:
                raise Refused(f"an entry of slurm_{kind.lower() if kind == 'QOS' else kind + 's'} has no name: {entry}")
            _names(kind, name, {"name": [name], **{key: sorted(words(entry[key])) if key in ("qos", "accounts")
                                                   else [str(entry[key])] for key in NAME_LISTS if entry.get(key)}})
            if name.lower() in seen:
                raise Refused(f"{kind} {name} is declared twice")
            seen.add(name.lower())
            if entry.get("state", "present") not in ("present", "absent"):
                raise Refused(f"{kind} {name}: state is present or absent, not {entry.get('state')!r}")
            known = set(QOS_FIELDS if kind == "QOS" else ASSOC_FIELDS) | {"name", "state"}
            known |= set(ACCOUNT_FIELDS) | {"parent"} if kind == "account" else set()
            known |= {"accounts", "default_account"} if kind == "user" else set()
            unknown = sorted(set(entry) - known)
            if unknown:
                raise Refused(f"{kind} {name}: unknown setting(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
            for key in ("max_wall",):
                if entry.get(key) is not None:
                    seconds(str(entry[key]))
            for key in ("max_tres_per_user", "max_tres_per_job"):
                if entry.get(key) is not None:
                    tres(str(entry[key]))
            if kind != "QOS" and entry.get("default_qos") and entry.get("qos") is not None \
                    and entry["default_qos"] not in words(entry["qos"]):
                raise Refused(f"{kind} {name}: default_qos {entry['default_qos']} is not one of its qos")
    for user in present(users):
        if not user.get("accounts"):
            raise Refused(f"user {user['name']}: accounts is empty (a Slurm user belongs to at least one account)")
        if user.get("default_account") and user["default_account"] not in user["accounts"]:
            raise Refused(f"user {user['name']}: default_account {user['default_account']} is not one of its accounts")


def plan(cluster: str, qos: list[dict], accounts: list[dict], users: list[dict],
         held_qos: list[dict[str, str]], held_accounts: list[dict[str, str]],
         held_assocs: list[dict[str, str]], held_users: list[dict[str, str]]) -> list[list[str]]:
    """The sacctmgr commands (without the leading options) that make the database what is declared:
    QOS first (accounts name them), accounts parents first, users; then removals, users first."""
    check(qos, accounts, users)
    qos_by_name = {row["Name"].lower(): row for row in held_qos}
    account_rows = {row["Account"].lower(): row for row in held_accounts}
    account_assocs = {row["Account"].lower(): row for row in held_assocs if not row["User"]}
    user_assocs = {(row["User"], row["Account"].lower()): row for row in held_assocs if row["User"]}
    user_rows = {row["User"]: row for row in held_users}
    commands: list[list[str]] = []

    for entry in present(qos):
        name = str(entry["name"]).lower()
        held = qos_by_name.get(name)
        changes = settings(QOS_FIELDS, entry, held)
        if held is None:
            commands.append(["add", "qos", name, *changes])
        elif changes:
            commands.append(["modify", "qos", "where", f"name={name}", "set", *changes])

    declared = {str(entry["name"]).lower(): entry for entry in present(accounts)}
    for name in _parents_first(declared):
        entry = declared[name]
        parent = str(entry.get("parent") or ROOT_ACCOUNT).lower()
        held, assoc = account_rows.get(name), account_assocs.get(name)
        if held is None or assoc is None:
            commands.append(["add", "account", name, f"cluster={cluster}", f"parent={parent}",
                             *settings(ACCOUNT_FIELDS, entry, None), *settings(ASSOC_FIELDS, entry, None)])
            continue
        if changes := settings(ACCOUNT_FIELDS, entry, held):
            commands.append(["modify", "account", "where", f"name={name}", "set", *changes])
        if assoc.get("ParentName", "").lower() != parent:
            commands.append(["modify", "account", "where", f"name={name}", f"cluster={cluster}", "set", f"parent={parent}"])
        if changes := settings(ASSOC_FIELDS, entry, assoc):
            commands.append(["modify", "account", "where", f"name={name}", f"cluster={cluster}", "set", *changes])

    for entry in present(users):
        name = str(entry["name"])
        chosen = [str(account).lower() for account in entry["accounts"]]
        default = str(entry.get("default_account") or "").lower()
        for account in chosen:
            assoc = user_assocs.get((name, account))
            if assoc is None:
                new_user = name not in user_rows and account == chosen[0]
                first = [f"defaultaccount={default or account}"] if new_user else []
                commands.append(["add", "user", name, f"account={account}", f"cluster={cluster}", *first,
                                 *settings(ASSOC_FIELDS, entry, None)])
            elif changes := settings(ASSOC_FIELDS, entry, assoc):
                commands.append(["modify", "user", "where", f"name={name}", f"account={account}", f"cluster={cluster}",
                                 "set", *changes])
        held_default = user_rows.get(name, {}).get("DefaultAccount", "").lower()
        if default and name in user_rows and held_default != default:
            commands.append(["modify", "user", "where", f"name={name}", "set", f"defaultaccount={default}"])

    for entry in absent(users):
        if str(entry["name"]) in user_rows:
            commands.append(["delete", "user", "where", f"name={entry['name']}", f"cluster={cluster}"])
    gone = {str(entry["name"]).lower() for entry in absent(accounts)} & set(account_rows)
    for name in reversed(_parents_first({name: {"parent": account_assocs.get(name, {}).get("ParentName")}
                                         for name in gone})):
        commands.append(["delete", "account", "where", f"name={name}", f"cluster={cluster}"])
    for entry in absent(qos):
        if str(entry["name"]).lower() in qos_by_name:
            commands.append(["delete", "qos", "where", f"name={str(entry['name']).lower()}"])
    return commands


def _parents_first(entries: dict[str, dict]) -> list[str]:
    """The names in an order where an account's parent, when it is among them, comes before it."""
    done: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in done:
            return
        if name in path:
            raise Refused(f"account {name}: its parents go round in a circle ({' -> '.join(path + (name,))})")
        parent = str(entries[name].get("parent") or ROOT_ACCOUNT).lower()
        if parent in entries:
            visit(parent, path + (name,))
        done.append(name)

    for name in sorted(entries):
        visit(name, ())
    return done


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "cluster": {"type": "str", "required": True},
            "qos": {"type": "list", "elements": "dict", "default": []},
            "accounts": {"type": "list", "elements": "dict", "default": []},
            "users": {"type": "list", "elements": "dict", "default": []},
            "validate_only": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    cluster = module.params["cluster"]
    if module.params["validate_only"]:
        try:
            check(module.params["qos"], module.params["accounts"], module.params["users"])
        except Refused as exc:
            module.fail_json(msg=f"Slurm accounting: {exc}")
        module.exit_json(changed=False, commands=[])

    def show(entity: str, fields: list[str], where: str | None = None) -> list[dict[str, str]]:
        rc, out, err = module.run_command(show_command(entity, fields, where))
        if rc != 0:
            module.fail_json(msg=f"sacctmgr show {entity} failed: {(err or out).strip().splitlines()[-1:]}")
        return parse_rows(out, fields)

    try:
        commands = plan(cluster, module.params["qos"], module.params["accounts"], module.params["users"],
                        show("qos", QOS_FORMAT), show("account", ACCOUNT_FORMAT),
                        show("association", ASSOC_FORMAT, cluster), show("user", USER_FORMAT))
    except Refused as exc:
        module.fail_json(msg=f"Slurm accounting: {exc}")
    said = [" ".join(["sacctmgr", *command]) for command in commands]
    if not module.check_mode:
        for command, line in zip(commands, said, strict=False):
            rc, out, err = module.run_command(SACCTMGR + command)
            if rc != 0:
                why = " ".join((err or out).split())
                module.fail_json(msg=f"{line} failed: {why}", commands=said)
    module.exit_json(changed=bool(commands), commands=said)


if __name__ == "__main__":
    main()
