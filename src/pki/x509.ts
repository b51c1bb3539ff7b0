/**
 * @peculiar/x509 set up for Bun: it needs `reflect-metadata` loaded before
 * it, and the runtime's WebCrypto as its provider. Import x509 from here,
 * never from the package directly.
 */
import "reflect-metadata";
import * as x509 from "@peculiar/x509";

x509.cryptoProvider.set(crypto);

export { x509 };
