"""Whether a value is a webhook URL Alertmanager can post alerts to: http:// or https://, a host
(with a port or not), then a path or nothing. Role monitoring's preflight checks
monitoring_alert_webhook_url with it (`is pycli.cluster.webhook_url`), and pycli's cluster model
refuses the same values when it reads an inventory, before any run (pycli.core.tree.plugin).
"""

from __future__ import annotations

import re

WEBHOOK_URL = re.compile(r"^https?://[^\s/?#]+(/\S*)?$")


def webhook_url(value: object) -> bool:
    return bool(WEBHOOK_URL.match(str(value)))


class TestModule:
    def tests(self):
        return {"webhook_url": webhook_url}
