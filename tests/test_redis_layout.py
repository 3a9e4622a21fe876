"""The direct Redis reader builds the same keys and fields as Feast's Redis online store."""

from __future__ import annotations

import pytest
from feast.infra.key_encoding_utils import serialize_entity_key
from feast.infra.online_stores.helpers import _mmh3
from feast.protos.feast.types.EntityKey_pb2 import EntityKey
from feast.protos.feast.types.Value_pb2 import Value

from features.redis_reader import (
    _decode,
    entity_redis_key,
    feature_field,
    parse_feast_connection_string,
)
from features.store import redis_connection_string


@pytest.mark.parametrize("value", ["u_1", "item-7@p2", "é€ unicode", ""])
def test_entity_key_is_feasts_serialization_plus_project(value: str) -> None:
    ek = EntityKey(join_keys=["user_id"], entity_values=[Value(string_val=value)])
    expected = serialize_entity_key(ek, entity_key_serialization_version=3) + b"proj_1"
    assert entity_redis_key("user_id", value, "proj_1") == expected


def test_feature_field_is_feasts_murmur3() -> None:
    for name in ("user_ctr_1h", "item_impressions_24h"):
        assert feature_field("item_stats", name) == _mmh3(f"item_stats:{name}")


def test_values_decode_like_the_proto_and_empty_means_missing() -> None:
    assert _decode(Value(int64_val=0).SerializeToString()) == 0.0  # a stored 0 is not missing
    assert _decode(Value(double_val=0.125).SerializeToString()) == 0.125
    assert _decode(Value().SerializeToString()) is None
    assert _decode(None) is None


def test_connection_string_round_trips_from_the_url_form() -> None:
    conn = redis_connection_string("redis://user:pw@10.0.0.1:6380/15")
    assert parse_feast_connection_string(conn) == {
        "host": "10.0.0.1",
        "port": 6380,
        "db": 15,
        "username": "user",
        "password": "pw",
    }
    assert parse_feast_connection_string("localhost:6379") == {"host": "localhost", "port": 6379}
