// Type declarations of imgate-client (src/imgate.js). Frames are as
// docs/protocol.md gives them; fields may be added by later server versions.

export type ImState = "connecting" | "online" | "offline" | "stopped";

/** Any JSON value (a message body is any JSON within IM_MAX_BODY). */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

export interface BackoffOptions {
  /** Base of the exponential backoff (default 200). */
  minMs?: number;
  /** Cap of the backoff (default 10000). Each wait is uniform in [0, min(maxMs, minMs * 2^attempt)). */
  maxMs?: number;
}

/** A WebSocket constructor as the browser's (or Node 20's with --experimental-websocket, or the `ws` package's). */
export interface WebSocketLike {
  readonly readyState: number;
  onopen: ((ev: any) => any) | null;
  onmessage: ((ev: { data: any }) => any) | null;
  onclose: ((ev: { code: number; reason: string }) => any) | null;
  onerror: ((ev: any) => any) | null;
  send(data: string): void;
  close(code?: number, reason?: string): void;
}
export type WebSocketConstructor = new (url: string) => WebSocketLike;

export interface ImClientOptions {
  /** WebSocket endpoint, e.g. "ws://127.0.0.1:8080/ws". One of url / urls is required. */
  url?: string;
  /** Endpoints tried in turn: the next one after a failure, a 1001 close or a `reconnect` frame. */
  urls?: string[];
  /** Base of the HTTP API (sync, conversations, ...), for every url. */
  httpUrl?: string;
  /** HTTP bases parallel to `urls` (one per node). */
  httpUrls?: string[];
  /** JWT for the first connection. Optional if getToken is given. */
  token?: string;
  /** Called for each (re)connection after the first, on 4001, on a 401, and before exp for the `refresh` op. */
  getToken?: () => string | Promise<string>;
  /** Default: globalThis.WebSocket. */
  WebSocket?: WebSocketConstructor;
  /** This install's stable device id (the login policy's `?device=`; 1-64 of [A-Za-z0-9_.:-]). */
  device?: string;
  /** `ios` | `android` | `web` | `desktop` | `other` (default `other`). A close 4005
   * ("replaced": a newer connection took this slot) stops the client with code "replaced". */
  platform?: "ios" | "android" | "web" | "desktop" | "other";
  /** Default: globalThis.fetch. */
  fetch?: typeof globalThis.fetch;
  backoff?: BackoffOptions;
  /** recv_ack batching delay (default 100 ms). */
  recvAckDelayMs?: number;
  /** Where sync starts (persist it from the "cursor" event). Default 0. */
  lastMid?: number;
  /** A ping after this long without a frame from the node (default 25000; 0: none). */
  pingIntervalMs?: number;
  /** No frame this long after a ping: the link is dead, reconnect (default 10000). */
  pingTimeoutMs?: number;
  /** A handshake taking longer counts as a failure (default 10000). */
  openTimeoutMs?: number;
  /** Calls other than send / groupSend fail with code "timeout" after this (default 15000; 0: never). */
  requestTimeoutMs?: number;
  /** Bound on one HTTP call (default 15000). */
  httpTimeoutMs?: number;
  /** Send `refresh` this long before the token's exp, at most half its lifetime ahead (default 30000; 0: never, 4001 then reconnects). */
  refreshAheadMs?: number;
  /** Messages per sync page (1-200, default 100). */
  syncPageSize?: number;
  /** A sync this long after a pushed message, to move the cursor (default 5000; 0: only at connections). */
  catchUpSyncMs?: number;
  /** Sends written and not yet acked at once (default 32); a `rate_limited` send waits and is written again. */
  maxInflightSends?: number;
  /** Mids remembered for dedup (default 5000). */
  dedupMax?: number;
  /** Positions remembered per room for dedup (default 1000). */
  roomDedupMax?: number;
  /** Recover a jump in a room's `pos` with a rejoin `since` (default true; false: a "room_gap" event at once). */
  roomRecoverJumps?: boolean;
  /** At most one automatic jump recovery per room this often (default 2000). */
  roomRecoverIntervalMs?: number;
}

/** Emoji -> how many users reacted with it (only emoji with a count above 0). */
export type ReactionCounts = Record<string, number>;

/** A 1:1 message (`op` "msg"); a recalled one carries `recalled: true` and `conv`, no body. */
export interface MsgFrame {
  op: "msg";
  mid: number;
  from: string;
  to: string;
  body?: Json;
  ts: number;
  conv?: string;
  recalled?: boolean;
  /** The mid of the message (same conversation) this one answers. */
  reply_to?: number;
  /** Unix ms of the last edit; absent if never edited. */
  edited?: number;
  /** Sync and history only, on messages that have any. */
  reactions?: ReactionCounts;
}

/** A group message (`op` "group_msg"). */
export interface GroupMsgFrame {
  op: "group_msg";
  mid: number;
  seq: number;
  group: string;
  from: string;
  body?: Json;
  ts: number;
  conv?: string;
  recalled?: boolean;
  reply_to?: number;
  edited?: number;
  reactions?: ReactionCounts;
}

export type ChatMessage = MsgFrame | GroupMsgFrame;

export interface AckFrame {
  op: "ack";
  re: number;
  cmid: string;
  mid: number;
  ts: number;
  /** group_send only. */
  seq?: number;
}

export interface OkFrame {
  op: "ok";
  re?: number;
}

export interface PresenceState {
  online: boolean;
  /** Unix ms; now while online; null if never seen. */
  last_seen: number | null;
}

export interface PresenceFrame {
  op: "presence";
  re?: number;
  users: Record<string, PresenceState>;
}

export interface ReadFrame {
  op: "read";
  conv: string;
  mid: number;
  unread: number;
}

export interface ReceiptFrame {
  op: "receipt";
  conv: string;
  mid: number;
}

export interface TypingFrame {
  op: "typing";
  conv: string;
  from: string;
}

export interface RecalledFrame {
  op: "recalled";
  mid: number;
  conv: string;
  by: string;
}

/** A message's new body: pushed to both users' devices (or the group's members online), or
 * made by the client when sync brings the edited version of a message it had already shown. */
export interface EditedFrame {
  op: "edited";
  mid: number;
  /** As this user names the conversation: the peer, or `g:GROUP`. */
  conv: string;
  body: Json;
  /** Unix ms of the edit. */
  edited: number;
}

/** `from` added (`on`) or removed its `emoji` on message `mid` (the reacting user's devices get it too). */
export interface ReactionFrame {
  op: "reaction";
  mid: number;
  conv: string;
  from: string;
  emoji: string;
  on: boolean;
}

/** A user's settings of one conversation. */
export interface ConvSettings {
  muted: boolean;
  pinned: boolean;
  archived: boolean;
}

/** This user's settings of `conv` changed (on any of its devices). */
export interface ConvSettingsFrame extends ConvSettings {
  op: "conv_settings";
  conv: string;
}

/** The answer of setConversation (`PATCH /v1/conversations/{conv}`). */
export interface ConvSettingsResult extends ConvSettings {
  ok: true;
  conv: string;
}

/** One page of reactionUsers (`GET /v1/messages/{mid}/reactions`). */
export interface ReactionUsersPage {
  /** In user id order. */
  users: string[];
  /** Pass back for the next page; null on the last one. */
  cursor: string | null;
}

export interface GroupEventFrame {
  op: "group_event";
  group: string;
  event: "added" | "removed" | "left" | "renamed" | "owner" | "dissolved";
  users: string[];
  by: string;
}

export interface NoticeFrame {
  op: "notice";
  body: Json;
  ts: number;
}

export interface FeedFrame {
  op: "feed";
  post: number;
  author: string;
  ts: number;
}

export interface RoomMessage {
  from: string;
  body: Json;
  ts: number;
  /** Absent when the node keeps no room history (IM_ROOM_HISTORY=0). */
  pos?: number;
}

export interface JoinedFrame {
  op: "joined";
  re?: number;
  room: string;
  online: number;
  users: number;
  /** Absent when the node keeps no room history; null before the room's first message. */
  epoch?: string | null;
  pos?: number;
  /** With history (or since): only positions this client had not shown yet. */
  msgs?: RoomMessage[];
  recovered?: boolean;
}

export interface LeftFrame {
  op: "left";
  re?: number;
  room: string;
  /** "kicked" on the room_left event. */
  reason?: string;
}

export interface RoomEvent {
  room: string;
  epoch: string | null;
  msgs: RoomMessage[];
}

/** Positions of a room that will never be emitted, told before the messages after them. */
export interface RoomGapEvent {
  room: string;
  /** The epoch of `after` (the one left when the room changed epoch). */
  epoch: string | null;
  /** The last position emitted before the hole. */
  after: number;
  /** The positions gone, inclusive [first, last] ranges; empty when unknown (another epoch). */
  missing: Array<[number, number]>;
  /** The positions the rejoin brought back (emitted as "room" right after). */
  recovered: number[];
  reason: "not_kept" | "epoch" | "off" | "rate_limited" | "failed";
}

export interface RoomRecoveredEvent {
  room: string;
  /** True: nothing was missed while disconnected. False: some messages are gone (show a divider). */
  recovered: boolean;
  epoch: string | null;
  /** The kept messages after the last position shown, deduped (not also sent as "room"). */
  msgs: RoomMessage[];
  /** The `joined` reply as the node sent it. */
  joined: JoinedFrame;
}

export interface ClosedEvent {
  code: number;
  reason: string;
}

/** Any frame as the node sent it. */
export interface Frame {
  op: string;
  [key: string]: unknown;
}

export interface ImClientEvents {
  state: ImState;
  message: ChatMessage;
  cursor: number;
  read: ReadFrame;
  receipt: ReceiptFrame;
  typing: TypingFrame;
  presence: PresenceFrame;
  recalled: RecalledFrame;
  /** A message already told (or older than the sync cursor), as it is now: sync brought it
   * again edited, with other reaction counts, or recalled. Replace what you have by `mid`. */
  changed: ChatMessage;
  edited: EditedFrame;
  reaction: ReactionFrame;
  conv_settings: ConvSettingsFrame;
  group_event: GroupEventFrame;
  notice: NoticeFrame;
  feed: FeedFrame;
  room: RoomEvent;
  room_recovered: RoomRecoveredEvent;
  room_gap: RoomGapEvent;
  room_left: LeftFrame;
  error: ImError;
  closed: ClosedEvent;
  unknown: Frame;
}

/** Protocol errors carry the node's `code`; the client adds its own ("stopped", "disconnected", "timeout", "offline", "http", ...). */
export class ImError extends Error {
  constructor(code: string, message?: string, extra?: object);
  code: string;
  /** HTTP status (http(), sync, and the 401 / 403 that stopped a connect); 0 for a network failure. */
  status?: number;
  /** The error frame or the frame that failed. */
  frame?: Frame;
  /** The cmid of a send / groupSend that failed: pass it back in `{cmid}` to retry exactly once. */
  cmid?: string;
  /** The close code that stopped the client (4001, 4003). */
  closeCode?: number;
  /** The HTTP answer's body. */
  body?: unknown;
  /** The room a failed rejoin was for. */
  room?: string;
}

export interface SendOptions {
  /** A cmid of your own (1-64 of [A-Za-z0-9_.:-]), e.g. to retry a send that failed with "unavailable". */
  cmid?: string;
  /** The mid of a message of the same conversation this one answers (`reply_to`; else `bad_request`). */
  replyTo?: number;
}

export class ImClient {
  constructor(options: ImClientOptions);

  readonly state: ImState;
  /** The `sub` of the current token. */
  readonly user: string | null;
  /** The WebSocket URL in use or to be tried next. */
  readonly url: string;
  /** The sync cursor. */
  lastMid: number;

  on<E extends keyof ImClientEvents>(event: E, fn: (arg: ImClientEvents[E]) => void): this;
  off<E extends keyof ImClientEvents>(event: E, fn: (arg: ImClientEvents[E]) => void): this;
  once<E extends keyof ImClientEvents>(event: E, fn: (arg: ImClientEvents[E]) => void): this;

  /** Resolves when online (after the first sync); rejects on 4003, a ban or a refused token. */
  connect(): Promise<void>;
  /** Stop for good (state "stopped"); pending calls reject with code "stopped". */
  close(): void;

  send(to: string, body: Json, options?: SendOptions): Promise<AckFrame>;
  groupSend(group: string, body: Json, options?: SendOptions): Promise<AckFrame>;
  read(conv: string, mid: number): Promise<OkFrame>;
  typing(conv: string): void;
  presenceSub(users: string[]): Promise<PresenceFrame>;
  presenceUnsub(users: string[]): Promise<OkFrame>;
  recall(mid: number): Promise<OkFrame>;
  /** The sender's new body (within IM_EDIT_WINDOW_S, never after a recall). */
  edit(mid: number, body: Json): Promise<OkFrame>;
  /** Add (default) or remove this user's emoji on a message. */
  react(mid: number, emoji: string, on?: boolean): Promise<OkFrame>;
  reactionUsers(mid: number, emoji: string, options?: { cursor?: string | null; limit?: number }): Promise<ReactionUsersPage>;
  /** Change some of this user's settings of `conv` (a peer, or `g:GROUP`); all its devices get "conv_settings". */
  setConversation(conv: string, settings: Partial<ConvSettings>): Promise<ConvSettingsResult>;

  join(room: string, options?: { history?: number; recoverJumps?: boolean }): Promise<JoinedFrame>;
  leave(room: string): Promise<LeftFrame>;
  roomSend(room: string, body: Json, options?: { prio?: 0 | 1 }): Promise<OkFrame>;
  /** What a rejoin would send as `since`; null before the room's first message. */
  roomPosition(room: string): { epoch: string; pos: number } | null;
  /** Automatic jump recovery on or off for a joined room (room_gap frames are always acted on). */
  setRoomRecoverJumps(room: string, on: boolean): void;

  http<T = any>(method: string, path: string, body?: unknown): Promise<T>;
  sync(): Promise<void>;
}
