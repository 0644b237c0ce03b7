"""The alert rules the monitoring role installs: files/alerts.yml, with a site's own `for:` per alert.

A rule's `for:` is how long its condition must hold before the alert fires. The file's values are
the defaults; monitoring_alert_for ({"NodeDown": "2m"}) sets others by alert name, and the rule's
texts that name its time ("has not answered for 1 minute") name the new one. With no override
the file goes out byte for byte; with one, as YAML of the same rules.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import yaml

# Prometheus's duration: one or more number-unit pairs, largest unit first (1h30m, 90s, 500ms).
DURATION = re.compile(r"^(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?$")


UNITS = {"y": "year", "w": "week", "d": "day", "h": "hour", "m": "minute", "s": "second", "ms": "millisecond"}


def spoken(duration: str) -> str:
    """A Prometheus duration as the rules' texts write it: 1m is "1 minute", 1h30m "1 hour 30 minutes"."""
    words = []
    for number, unit in re.findall(r"(\d+)(ms|[ywdhms])", duration):
        words.append(f"{int(number)} {UNITS[unit]}{'' if int(number) == 1 else 's'}")
    return " ".join(words)


def monitoring_alert_rules(text: str, overrides: Mapping[str, object] | None) -> str:
    """alerts.yml's text with the `for:` of the alerts `overrides` names set to its values.

    An alert name the file does not have, or a value that is not a Prometheus duration, is a
    ValueError naming it (the site's setting is wrong, and the run stops there)."""
    if not overrides:
        return text
    if not isinstance(overrides, Mapping):
        raise ValueError(f"monitoring_alert_for is {overrides!r}: give a mapping of alert name to duration, "
                         'e.g. {"NodeDown": "2m"}')
    document = yaml.safe_load(text)
    rules = [rule for group in document["groups"] for rule in group["rules"] if "alert" in rule]
    names = [rule["alert"] for rule in rules]
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        raise ValueError(f"monitoring_alert_for names no alert of the role's rules: {', '.join(unknown)} "
                         f"(its alerts: {', '.join(names)})")
    for name, value in overrides.items():
        if not (isinstance(value, str) and value and DURATION.match(value)):
            raise ValueError(f"monitoring_alert_for: {name}'s {value!r} is not a Prometheus duration (e.g. 90s, 2m, 1h)")
    for rule in rules:
        if rule["alert"] in overrides:
            new = "".join(overrides[rule["alert"]])  # a plain str: Ansible's own str type is no YAML
            # The texts that say how long the condition has held ("for 5 minutes") say the new time.
            if "for" in rule:
                old, said = spoken(str(rule["for"])), spoken(new)
                rule["annotations"] = {key: text.replace(old, said) if isinstance(text, str) else text
                                       for key, text in rule.get("annotations", {}).items()}
            rule["for"] = new
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=1000)


class FilterModule:
    def filters(self):
        return {"monitoring_alert_rules": monitoring_alert_rules}
