from pathlib import Path

import pytest

from pycli.errors import BadInput
from pycli.local_image import ImageSpec

PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_tag_is_stable_and_changes_with_every_input(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text(PEM)
    base = ImageSpec()
    assert base.tag == ImageSpec().tag and base.tag.startswith("pycli-node:bookworm-")
    assert ImageSpec(mirror="http://mirror.example/debian").tag != base.tag
    with_ca = ImageSpec(ca_bundle=ca).tag
    assert with_ca != base.tag
    ca.write_text(PEM + PEM)
    assert ImageSpec(ca_bundle=ca).tag != with_ca


def test_security_mirror_sits_beside_the_main_archive():
    assert ImageSpec(mirror="http://deb.debian.org/debian/").security_mirror == "http://deb.debian.org/debian-security"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (ImageSpec(suite="sid"), "not supported"),
        (ImageSpec(mirror="ftp://x/debian"), "not an http"),
        (ImageSpec(ca_bundle=Path("/nonexistent/ca.pem")), "cannot read CA bundle"),
    ],
)
def test_bad_image_inputs_are_refused(spec, message):
    with pytest.raises(BadInput, match=message):
        spec.validate()


def test_a_ca_bundle_without_certificates_is_refused(tmp_path):
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(BadInput, match="no PEM certificate"):
        ImageSpec(ca_bundle=junk).validate()
