"""What the CLI puts in a URL: ids and filter values arrive as they were typed."""

from __future__ import annotations

from urllib.parse import parse_qs, unquote

from yarl import URL

from dlqapp.cli.base import query_of, segment


def test_a_filter_value_with_url_syntax_in_it_stays_one_value():
    """`dlq-list --q 'a&b'` sent `q=a&b`: the worker searched for `a`."""
    query = query_of({"q": "a&b=c #d+e", "limit": 5, "model": None, "error_class": ""})
    assert parse_qs(query) == {"q": ["a&b=c #d+e"], "limit": ["5"]}


def test_an_id_is_one_path_segment():
    assert (
        "/" not in segment("team/batch/../x?y#z") and unquote(segment("team/batch/../x?y#z")) == "team/batch/../x?y#z"
    )


def test_a_dot_id_reaches_the_worker_as_itself():
    """`dlq-show ..` asked for `/dlq/../`, which a URL library resolves to `/`."""
    for request_id in (".", "..", "...", "a.b", "../x"):
        url = URL(f"http://worker:6066/dlq/{segment(request_id)}/", encoded=True)
        assert url.raw_path.count("/") == 3 and unquote(url.raw_path.split("/")[2]) == request_id
