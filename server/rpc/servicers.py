"""gRPC servicers: convert the request, call one domain operation, convert the result.

Errors are raised as domain errors and mapped to statuses by the interceptor; the identity
comes from the interceptor too (never from a request field).
"""

from __future__ import annotations

import grpc

from memoria.v1 import audit_service_pb2 as audit_pb
from memoria.v1 import audit_service_pb2_grpc as audit_grpc
from memoria.v1 import conversation_search_service_pb2 as search_pb
from memoria.v1 import conversation_search_service_pb2_grpc as search_grpc
from memoria.v1 import memory_block_service_pb2 as pb
from memoria.v1 import memory_block_service_pb2_grpc as pb_grpc
from server.domain.audit import AuditLog
from server.domain.export import Exporter
from server.domain.inspection import TurnInspector
from server.domain.intake import TurnIntake
from server.domain.listing import ConversationList
from server.domain.memory import MemoryBlocks
from server.domain.removal import ConversationRemoval
from server.domain.search import ConversationSearch
from server.rpc.convert import (
    audit_event_message,
    audit_request,
    block_message,
    conversation_message,
    duplicate_messages,
    export_record_message,
    exported_turn_message,
    index_turn_response,
    inspection_message,
    origin_messages,
    search_bounds_of,
    search_hit_message,
    settings_message,
    turn_ref_of,
    turn_time_of,
    writer_of,
)
from server.rpc.interceptor import current_identity


class MemoryBlockServicer(pb_grpc.MemoryBlockServiceServicer):
    """memoria.v1.MemoryBlockService."""

    def __init__(self, blocks: MemoryBlocks):
        self._blocks = blocks

    def GetMemoryBlock(
        self, request: pb.GetMemoryBlockRequest, context: grpc.ServicerContext
    ) -> pb.GetMemoryBlockResponse:
        if request.view != pb.MEMORY_BLOCK_VIEW_FULL:
            return pb.GetMemoryBlockResponse(
                memory_block=block_message(self._blocks.get(current_identity()))
            )
        annotated = self._blocks.get_annotated(current_identity())
        return pb.GetMemoryBlockResponse(
            memory_block=block_message(annotated.block),
            line_origins=origin_messages(annotated.origins),
            duplicate_lines=duplicate_messages(annotated.duplicates),
        )

    def RenderMemoryBlock(
        self, request: pb.RenderMemoryBlockRequest, context: grpc.ServicerContext
    ) -> pb.RenderMemoryBlockResponse:
        r = self._blocks.render(current_identity(), turn_ref_of(request))
        return pb.RenderMemoryBlockResponse(
            prompt_section=r.prompt_section,
            etag=r.etag,
            char_count=r.char_count,
            char_limit=r.char_limit,
        )

    def RewriteMemoryBlock(
        self, request: pb.RewriteMemoryBlockRequest, context: grpc.ServicerContext
    ) -> pb.RewriteMemoryBlockResponse:
        writer = writer_of(request.writer)
        etag = request.etag if request.HasField("etag") else None
        result = self._blocks.rewrite(
            current_identity(), request.text, writer, etag, turn_ref_of(request)
        )
        return pb.RewriteMemoryBlockResponse(
            memory_block=block_message(result.block),
            removed_lines=result.removed_lines,
            added_lines=result.added_lines,
            changed=result.changed,
            duplicate_lines=duplicate_messages(result.duplicates),
        )

    def DeleteMemoryBlock(
        self, request: pb.DeleteMemoryBlockRequest, context: grpc.ServicerContext
    ) -> pb.DeleteMemoryBlockResponse:
        writer = writer_of(request.writer)
        etag = request.etag if request.HasField("etag") else None
        result = self._blocks.delete(current_identity(), writer, etag)
        return pb.DeleteMemoryBlockResponse(
            deleted=result.deleted, removed_line_count=result.removed_line_count
        )

    def GetMemorySettings(
        self, request: pb.GetMemorySettingsRequest, context: grpc.ServicerContext
    ) -> pb.GetMemorySettingsResponse:
        view = self._blocks.settings(current_identity())
        return pb.GetMemorySettingsResponse(settings=settings_message(view))

    def UpdateMemorySettings(
        self, request: pb.UpdateMemorySettingsRequest, context: grpc.ServicerContext
    ) -> pb.UpdateMemorySettingsResponse:
        writer = writer_of(request.writer)
        enabled = request.memory_enabled if request.HasField("memory_enabled") else None
        view = self._blocks.update_settings(current_identity(), writer, enabled)
        return pb.UpdateMemorySettingsResponse(settings=settings_message(view))


class AuditServicer(audit_grpc.AuditServiceServicer):
    """memoria.v1.AuditService."""

    def __init__(self, audit: AuditLog):
        self._audit = audit

    def ListAuditEvents(
        self, request: audit_pb.ListAuditEventsRequest, context: grpc.ServicerContext
    ) -> audit_pb.ListAuditEventsResponse:
        page = self._audit.list(current_identity(), audit_request(request))
        return audit_pb.ListAuditEventsResponse(
            events=[audit_event_message(e) for e in page.events],
            next_page_token=page.next_page_token,
        )


class ConversationSearchServicer(search_grpc.ConversationSearchServiceServicer):
    """memoria.v1.ConversationSearchService: each RPC on the use case it belongs to."""

    def __init__(
        self,
        intake: TurnIntake,
        search: ConversationSearch,
        removal: ConversationRemoval,
        inspector: TurnInspector,
        exporter: Exporter,
        listing: ConversationList,
    ) -> None:
        self._intake = intake
        self._search = search
        self._removal = removal
        self._inspector = inspector
        self._exporter = exporter
        self._listing = listing

    def IndexTurn(
        self, request: search_pb.IndexTurnRequest, context: grpc.ServicerContext
    ) -> search_pb.IndexTurnResponse:
        result = self._intake.index_turn(
            current_identity(),
            request.conversation_id,
            request.turn_id,
            request.question,
            request.answer,
            turn_time_of(request),
            wait=request.wait,
        )
        return index_turn_response(result)

    def SearchConversations(
        self, request: search_pb.SearchConversationsRequest, context: grpc.ServicerContext
    ) -> search_pb.SearchConversationsResponse:
        hits = self._search.search(
            current_identity(),
            request.query,
            request.page_size,
            turn_ref_of(request),
            search_bounds_of(request),
        )
        return search_pb.SearchConversationsResponse(hits=[search_hit_message(h) for h in hits])

    def DeleteConversation(
        self, request: search_pb.DeleteConversationRequest, context: grpc.ServicerContext
    ) -> search_pb.DeleteConversationResponse:
        count = self._removal.delete_conversation(current_identity(), request.conversation_id)
        return search_pb.DeleteConversationResponse(deleted_turn_count=count)

    def ErasePrincipalData(
        self, request: search_pb.ErasePrincipalDataRequest, context: grpc.ServicerContext
    ) -> search_pb.ErasePrincipalDataResponse:
        erased = self._removal.erase(current_identity(), request.principal_id)
        return search_pb.ErasePrincipalDataResponse(
            removed_line_count=erased.removed_line_count,
            deleted_turn_count=erased.deleted_turn_count,
            deleted_inspection_count=erased.deleted_inspection_count,
        )

    def GetTurnInspection(
        self, request: search_pb.GetTurnInspectionRequest, context: grpc.ServicerContext
    ) -> search_pb.GetTurnInspectionResponse:
        view = self._inspector.inspect(current_identity(), turn_ref_of(request))
        return search_pb.GetTurnInspectionResponse(inspection=inspection_message(view))

    def ExportPrincipalData(
        self, request: search_pb.ExportPrincipalDataRequest, context: grpc.ServicerContext
    ) -> search_pb.ExportPrincipalDataResponse:
        page = self._exporter.page(current_identity(), request.page_size, request.page_token)
        return search_pb.ExportPrincipalDataResponse(
            records=[export_record_message(r) for r in page.records],
            next_page_token=page.next_page_token,
            turn_retention_days=page.turn_retention_days,
        )

    def ListConversations(
        self, request: search_pb.ListConversationsRequest, context: grpc.ServicerContext
    ) -> search_pb.ListConversationsResponse:
        page = self._listing.conversations(
            current_identity(), request.page_size, request.page_token
        )
        return search_pb.ListConversationsResponse(
            conversations=[conversation_message(c) for c in page.conversations],
            next_page_token=page.next_page_token,
        )

    def ListConversationTurns(
        self, request: search_pb.ListConversationTurnsRequest, context: grpc.ServicerContext
    ) -> search_pb.ListConversationTurnsResponse:
        page = self._listing.turns(
            current_identity(), request.conversation_id, request.page_size, request.page_token
        )
        return search_pb.ListConversationTurnsResponse(
            turns=[exported_turn_message(t) for t in page.turns],
            next_page_token=page.next_page_token,
        )
