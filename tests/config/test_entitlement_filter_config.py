"""``Entitlement/Grant/Filter`` (config/security.py rule 2): an entitlement filter is
parsed with its grant, must compile, must restrict a read permission, and is refused
beside ``NamedConsumers``; each refusal names the element's path."""

from __future__ import annotations

import pytest

from conveyor.security.users import UsersFile
from tests.config.config_helpers import loads, refused

GRANT_PATH = "AMPSConfig/Entitlement/Grant[2]"


@pytest.fixture
def xml(tmp_path):
    users = tmp_path / "users"
    UsersFile(users).add("eu", "pw")

    def make(grant: str) -> str:
        return ("<AMPSConfig><Authentication><UsersFile>" + str(users) + "</UsersFile></Authentication>"
                "<Entitlement><Grant><User>eu</User><Publish>orders</Publish></Grant>"
                f"<Grant><User>eu</User>{grant}</Grant></Entitlement></AMPSConfig>")
    return make


def test_a_grant_carries_its_filter(xml):
    config = loads(xml("<Subscribe>orders</Subscribe><Consume>work</Consume><Filter>/region = 'EU'</Filter>"))
    plain, filtered = config.entitlement.grants
    assert plain.filter is None
    assert filtered.filter == "/region = 'EU'" and filtered.subscribe == ("orders",) and filtered.consume == ("work",)


def test_a_filter_that_does_not_compile_is_refused_with_its_path(xml):
    refused(xml("<Sow>orders</Sow><Filter>/region = </Filter>"), f"{GRANT_PATH}/Filter", "invalid Filter",
            hint="filter expression")


def test_a_filter_that_restricts_nothing_is_refused(xml):
    refused(xml("<Publish>orders</Publish><Acknowledge>work</Acknowledge><Filter>/a = 1</Filter>"),
            f"{GRANT_PATH}/Filter", "restricts nothing", hint="add the names")


def test_a_filter_beside_named_consumers_is_refused(xml):
    refused(xml("<Consume>work</Consume><NamedConsumers>work</NamedConsumers><Filter>/a = 1</Filter>"),
            f"{GRANT_PATH}/Filter", "NamedConsumers", hint="without <Filter>")


def test_one_filter_per_grant(xml):
    with pytest.raises(Exception, match="Filter"):
        loads(xml("<Sow>orders</Sow><Filter>/a = 1</Filter><Filter>/b = 1</Filter>"))
