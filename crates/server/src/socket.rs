//! Options applied to every accepted client socket.

/// Kernel send buffer of each client socket. Small on purpose: audio that a slow client cannot
/// take should be dropped by the server's bounded queue (and counted), not pile up for seconds in
/// the kernel. 64 KiB (the kernel doubles it) is still ~30 s of the server's Opus output.
pub const SOCKET_SEND_BUFFER: usize = 64 << 10;

/// Per-connection socket options: no Nagle delay, bounded send buffer.
pub(crate) fn tune_socket(tcp: &tokio::net::TcpStream) {
    let _ = tcp.set_nodelay(true);
    let _ = socket2::SockRef::from(tcp).set_send_buffer_size(SOCKET_SEND_BUFFER);
}
