"""Each line's origin and the block's repeated lines through the real server (issue 25 items 4
and 7), on SQLite and PostgreSQL: GetMemoryBlock's `line_origins` and `duplicate_lines`,
RewriteMemoryBlock's `duplicate_lines`, and nothing left of an origin after Clear all or erasure."""

from __future__ import annotations

from memoria.v1 import conversation_search_service_pb2 as search_pb
from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as pb
from tests.api.conftest import Api

MODEL, USER = block_pb.WRITER_MODEL, block_pb.WRITER_USER


def _rewrite(
    api: Api,
    principal: str,
    text: str,
    writer: block_pb.Writer.ValueType,
    turn: tuple[str, str] | None,
) -> pb.RewriteMemoryBlockResponse:
    request = pb.RewriteMemoryBlockRequest(text=text, writer=writer)
    if turn is not None:
        request.turn.CopyFrom(block_pb.TurnReference(conversation_id=turn[0], turn_id=turn[1]))
    return api.blocks.RewriteMemoryBlock(request, metadata=api.who(principal))


def _get(api: Api, principal: str) -> pb.GetMemoryBlockResponse:
    return api.blocks.GetMemoryBlock(
        pb.GetMemoryBlockRequest(view=pb.MEMORY_BLOCK_VIEW_FULL), metadata=api.who(principal)
    )


def test_lines_say_who_added_them_when_and_in_which_turn(api: Api) -> None:
    who = "ana"
    first = _rewrite(api, who, "Preferred name: Ana\nJira: acct-1", MODEL, ("c-1", "3"))
    assert list(first.duplicate_lines) == []
    second = _rewrite(api, who, "Preferred name: Ana\nLikes tea\nJira: acct-1", USER, None)
    origins = _get(api, who).line_origins
    assert [(o.line_index, o.writer) for o in origins] == [(0, MODEL), (1, USER), (2, MODEL)]
    assert origins[0].turn == block_pb.TurnReference(conversation_id="c-1", turn_id="3")
    assert not origins[1].HasField("turn")
    assert origins[0].add_time == first.memory_block.update_time
    assert origins[1].add_time == second.memory_block.update_time
    # Another person's writes are never anyone's origins.
    assert list(_get(api, "bob").line_origins) == []


def test_only_the_full_view_reads_origins_and_duplicates(api: Api) -> None:
    """Origins read the audit log, so only MEMORY_BLOCK_VIEW_FULL has them (and the duplicate
    lines); the default view, what every other reader gets, costs what reading the block costs."""
    who = "ana"
    _rewrite(api, who, "Likes tea\nlikes TEA", MODEL, ("c-1", "1"))
    for view in (pb.MEMORY_BLOCK_VIEW_UNSPECIFIED, pb.MEMORY_BLOCK_VIEW_BASIC):
        basic = api.blocks.GetMemoryBlock(
            pb.GetMemoryBlockRequest(view=view), metadata=api.who(who)
        )
        assert basic.memory_block.text == "Likes tea\nlikes TEA"
        assert list(basic.line_origins) == [] and list(basic.duplicate_lines) == []
    full = _get(api, who)
    assert [o.line_index for o in full.line_origins] == [0, 1]
    assert [list(g.line_indexes) for g in full.duplicate_lines] == [[0, 1]]


def test_repeats_are_pointed_out_and_saved_as_written(api: Api) -> None:
    who = "ana"
    text = "Likes tea\nPreferred name: Ana\nlikes  TEA\nPreferred name is Ana"
    answer = _rewrite(api, who, text, MODEL, None)
    assert answer.memory_block.text == text
    groups = [(g.kind, list(g.line_indexes), list(g.lines)) for g in answer.duplicate_lines]
    assert groups == [
        (pb.DUPLICATE_KIND_REPEATED, [0, 2], ["Likes tea", "likes  TEA"]),
        (
            pb.DUPLICATE_KIND_NEAR_DUPLICATE,
            [1, 3],
            ["Preferred name: Ana", "Preferred name is Ana"],
        ),
    ]
    assert list(_get(api, who).duplicate_lines) == list(answer.duplicate_lines)


def test_clear_all_and_erasure_leave_no_origin(api: Api) -> None:
    who = "ana"
    _rewrite(api, who, "Secret project: Falcon", MODEL, ("c-1", "1"))
    api.blocks.DeleteMemoryBlock(pb.DeleteMemoryBlockRequest(writer=USER), metadata=api.who(who))
    assert list(_get(api, who).line_origins) == []
    # Written again: its origin is the new write, not the cleared one.
    again = _rewrite(api, who, "Secret project: Falcon", USER, None)
    origins = _get(api, who).line_origins
    assert [(o.writer, o.add_time) for o in origins] == [(USER, again.memory_block.update_time)]
    api.search.ErasePrincipalData(search_pb.ErasePrincipalDataRequest(), metadata=api.who(who))
    after = _get(api, who)
    assert after.memory_block.text == "" and list(after.line_origins) == []
