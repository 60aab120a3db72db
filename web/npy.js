// Reads the .npy files the pages fetch (PyTorch's fixtures, native outputs): little-endian
// float32, int64 and bool, C order. Anything else throws, naming what it found.

export async function fetchNpy(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  return parseNpy(await response.arrayBuffer(), url);
}

export function parseNpy(buffer, name = 'npy') {
  const bytes = new Uint8Array(buffer);
  const magic = String.fromCharCode(...bytes.slice(1, 6));
  if (bytes[0] !== 0x93 || magic !== 'NUMPY') throw new Error(`${name}: not an .npy file`);
  const view = new DataView(buffer);
  const major = bytes[6];
  const [headerLen, start] = major === 1 ? [view.getUint16(8, true), 10] : [view.getUint32(8, true), 12];
  const header = new TextDecoder().decode(bytes.slice(start, start + headerLen));
  const descr = /'descr':\s*'([^']+)'/.exec(header)?.[1];
  const fortran = /'fortran_order':\s*True/.test(header);
  const shapeText = /'shape':\s*\(([^)]*)\)/.exec(header)?.[1];
  if (!descr || shapeText === undefined || fortran) throw new Error(`${name}: unsupported header ${header.trim()}`);
  const shape = shapeText.split(',').map((s) => s.trim()).filter((s) => s).map(Number);
  const count = shape.reduce((a, b) => a * b, 1);
  const offset = start + headerLen;
  const data = buffer.slice(offset);
  switch (descr) {
    case '<f4': return { shape, data: new Float32Array(data, 0, count) };
    case '<i8': return { shape, data: Array.from(new BigInt64Array(data, 0, count), Number) };
    case '|b1': return { shape, data: new Uint8Array(data, 0, count) };
    default: throw new Error(`${name}: dtype ${descr} is not read here`);
  }
}
