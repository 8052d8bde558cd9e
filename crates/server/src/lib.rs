//! WebSocket server speaking Kyutai's `/api/chat` protocol.
