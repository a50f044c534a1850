package proxy

// The protocol's message types, named as the Postgres documentation's
// "Message Formats" names them. A type byte means different messages in
// each direction ('C' is the client's Close and the server's
// CommandComplete, 'D', 'E' and 'S' likewise), so each direction has its
// own Go type: a client's type compared with a server's constant does not
// compile. A header's byte becomes one of them where the relay knows which
// side it read it from (clientToServer, serverToClient, side.dispatch).
// Only the types the proxy acts on or sends are named; it forwards the
// rest untouched.

// clientMsg is the type byte of a message the client (frontend) sends.
type clientMsg byte

const (
	clientMsgBind         clientMsg = 'B' // Bind
	clientMsgClose        clientMsg = 'C' // Close (a statement or portal)
	clientMsgDescribe     clientMsg = 'D' // Describe (a statement or portal)
	clientMsgExecute      clientMsg = 'E' // Execute
	clientMsgFunctionCall clientMsg = 'F' // FunctionCall
	clientMsgFlush        clientMsg = 'H' // Flush
	clientMsgParse        clientMsg = 'P' // Parse
	clientMsgQuery        clientMsg = 'Q' // Query (the simple protocol)
	clientMsgSync         clientMsg = 'S' // Sync
	clientMsgTerminate    clientMsg = 'X' // Terminate
	// clientMsgPassword is PasswordMessage, SASLInitialResponse,
	// SASLResponse or GSSResponse: which one, the authentication request
	// it answers says.
	clientMsgPassword clientMsg = 'p'
)

// serverMsg is the type byte of a message the server (backend) sends.
type serverMsg byte

const (
	serverMsgParseComplete   serverMsg = '1' // ParseComplete
	serverMsgBindComplete    serverMsg = '2' // BindComplete
	serverMsgCloseComplete   serverMsg = '3' // CloseComplete
	serverMsgCommandComplete serverMsg = 'C' // CommandComplete
	serverMsgDataRow         serverMsg = 'D' // DataRow
	serverMsgErrorResponse   serverMsg = 'E' // ErrorResponse
	serverMsgEmptyQuery      serverMsg = 'I' // EmptyQueryResponse
	serverMsgBackendKeyData  serverMsg = 'K' // BackendKeyData
	serverMsgNoticeResponse  serverMsg = 'N' // NoticeResponse
	serverMsgAuthentication  serverMsg = 'R' // AuthenticationOk, AuthenticationSASL, ...
	serverMsgParameterStatus serverMsg = 'S' // ParameterStatus
	serverMsgRowDescription  serverMsg = 'T' // RowDescription
	serverMsgReadyForQuery   serverMsg = 'Z' // ReadyForQuery
	serverMsgNoData          serverMsg = 'n' // NoData
	serverMsgPortalSuspended serverMsg = 's' // PortalSuspended
)

// txStatus is ReadyForQuery's transaction status indicator.
type txStatus byte

const (
	txIdle    txStatus = 'I' // idle: not in a transaction block
	txInBlock txStatus = 'T' // in a transaction block
	txFailed  txStatus = 'E' // in a failed transaction block (queries refused until it ends)
)

// target is what a Describe or Close names: a prepared statement or a
// portal.
type target byte

const (
	targetStatement target = 'S'
	targetPortal    target = 'P'
)

// The one-byte answers to an SSLRequest (and to a GSSENCRequest, refused).
const (
	encryptionAccepted byte = 'S'
	encryptionRefused  byte = 'N'
)
