/** Byte buffers shared by the store and the wire. */

/**
 * A plain Uint8Array of `n` bytes that are not zeroed first, for buffers
 * whose every byte is written at once (zeroing a fresh megabyte showed in
 * profiles). Plain, not a Buffer: `Buffer#slice` shares memory where
 * `Uint8Array#slice` copies, and callers rely on the copy.
 */
export function uninitialized(n: number): Uint8Array {
  const b = Buffer.allocUnsafeSlow(n);
  return new Uint8Array(b.buffer, b.byteOffset, n);
}
