// weft's `Buffer` global: the part of the Node.js Buffer API that device
// codecs written for ChirpStack use, written in plain JavaScript over
// Uint8Array so that it runs under the same time and memory limits as the
// codec that calls it. Evaluated as an expression: a function that builds
// and returns `Buffer`. The engine runs it in a context the first time a
// script there reads the global `Buffer` (see `LAZY_BUFFER` in worker.rs).
(function () {
  'use strict';
  var U8 = Uint8Array;
  var HEX = '0123456789abcdef';
  var B64 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/';
  var B64_VALUE = {};
  for (var i = 0; i < 64; i++) B64_VALUE[B64.charAt(i)] = i;
  B64_VALUE['-'] = 62; // base64url's alphabet is accepted too
  B64_VALUE['_'] = 63;

  // A scratch area for reading and writing floats without allocating.
  var scratch = new ArrayBuffer(8);
  var scratchBytes = new U8(scratch);
  var scratchF32 = new Float32Array(scratch);
  var scratchF64 = new Float64Array(scratch);
  var littleEndianHost = new U8(new Uint16Array([1]).buffer)[0] === 1;

  class FastBuffer extends U8 {}

  // `Buffer(x)` and `new Buffer(x)` (deprecated in Node, still found in
  // codecs) behave as `Buffer.from(x)`, or `Buffer.alloc(n)` for a number.
  function Buffer(value, encodingOrOffset, length) {
    if (typeof value === 'number') return alloc(value);
    return from(value, encodingOrOffset, length);
  }
  Buffer.prototype = FastBuffer.prototype;
  Object.defineProperty(Buffer.prototype, 'constructor', {
    value: Buffer, writable: true, configurable: true, enumerable: false
  });

  function make(length) {
    return new FastBuffer(length);
  }

  function rangeError(name, min, max, received) {
    var range = max === undefined ? min : '>= ' + min + ' and <= ' + max;
    var error = new RangeError('The value of "' + name + '" is out of range. It must be ' +
      range + '. Received ' + received);
    error.code = 'ERR_OUT_OF_RANGE';
    return error;
  }

  function typeError(message) {
    var error = new TypeError(message);
    error.code = 'ERR_INVALID_ARG_TYPE';
    return error;
  }

  function checkLength(n) {
    if (typeof n !== 'number') throw typeError('The "size" argument must be of type number. Received ' + typeof n);
    if (!(n >= 0 && n <= 0x7fffffff)) throw rangeError('size', 0, 0x7fffffff, n);
    return Math.floor(n);
  }

  // Node's check of a read or write position: an integer with `size` bytes
  // of the buffer after it.
  function checkOffset(buf, offset, size) {
    if (offset === undefined) offset = 0;
    if (typeof offset !== 'number') throw typeError('The "offset" argument must be of type number. Received ' + typeof offset);
    var last = buf.length - size;
    if (offset !== Math.floor(offset) || offset < 0 || offset > last) {
      if (offset !== Math.floor(offset)) throw rangeError('offset', 'an integer', undefined, offset);
      if (last < 0) {
        var error = new RangeError('Attempt to access memory outside buffer bounds');
        error.code = 'ERR_BUFFER_OUT_OF_BOUNDS';
        throw error;
      }
      throw rangeError('offset', 0, last, offset);
    }
    return offset;
  }

  function checkValue(value, min, max) {
    if (typeof value !== 'number') value = Number(value);
    if (!(value >= min && value <= max)) throw rangeError('value', min, max, value);
    return value;
  }

  function normalizeEncoding(encoding) {
    if (encoding === undefined || encoding === null) return 'utf8';
    var e = String(encoding).toLowerCase();
    switch (e) {
      case 'utf8': case 'utf-8': return 'utf8';
      case 'hex': return 'hex';
      case 'base64': return 'base64';
      case 'base64url': return 'base64url';
      case 'ascii': return 'ascii';
      case 'latin1': case 'binary': return 'latin1';
      case 'ucs2': case 'ucs-2': case 'utf16le': case 'utf-16le': return 'utf16le';
    }
    var error = new TypeError('Unknown encoding: ' + encoding);
    error.code = 'ERR_UNKNOWN_ENCODING';
    throw error;
  }

  // ---- strings to bytes ----

  function utf8Bytes(s) {
    var out = [];
    for (var i = 0; i < s.length; i++) {
      var c = s.charCodeAt(i);
      if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length) {
        var d = s.charCodeAt(i + 1);
        if (d >= 0xdc00 && d <= 0xdfff) {
          c = 0x10000 + ((c - 0xd800) << 10) + (d - 0xdc00);
          i++;
        }
      }
      if (c >= 0xd800 && c <= 0xdfff) c = 0xfffd; // a lone surrogate
      if (c < 0x80) out.push(c);
      else if (c < 0x800) out.push(0xc0 | (c >> 6), 0x80 | (c & 63));
      else if (c < 0x10000) out.push(0xe0 | (c >> 12), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
      else out.push(0xf0 | (c >> 18), 0x80 | ((c >> 12) & 63), 0x80 | ((c >> 6) & 63), 0x80 | (c & 63));
    }
    return out;
  }

  // Node decodes hex pair by pair and stops at the first pair that is not hex.
  function hexBytes(s) {
    var out = [];
    for (var i = 0; i + 1 < s.length; i += 2) {
      var hi = parseInt(s.charAt(i), 16);
      var lo = parseInt(s.charAt(i + 1), 16);
      if (hi !== hi || lo !== lo) break;
      out.push(hi * 16 + lo);
    }
    return out;
  }

  // Lenient like Node: both alphabets, padding optional, anything else
  // (whitespace, line breaks) skipped, decoding stops at '='.
  function base64Bytes(s) {
    var out = [];
    var bits = 0;
    var count = 0;
    for (var i = 0; i < s.length; i++) {
      var ch = s.charAt(i);
      if (ch === '=') break;
      var v = B64_VALUE[ch];
      if (v === undefined) continue;
      bits = (bits << 6) | v;
      count += 6;
      if (count >= 8) {
        count -= 8;
        out.push((bits >> count) & 0xff);
      }
    }
    return out;
  }

  function stringBytes(s, encoding) {
    switch (normalizeEncoding(encoding)) {
      case 'hex': return hexBytes(s);
      case 'base64': case 'base64url': return base64Bytes(s);
      case 'ascii': case 'latin1': {
        var out = [];
        for (var i = 0; i < s.length; i++) out.push(s.charCodeAt(i) & 0xff);
        return out;
      }
      case 'utf16le': {
        var wide = [];
        for (var j = 0; j < s.length; j++) {
          var c = s.charCodeAt(j);
          wide.push(c & 0xff, c >> 8);
        }
        return wide;
      }
      default: return utf8Bytes(s);
    }
  }

  // ---- bytes to strings ----

  function utf8Text(buf, start, end) {
    var out = '';
    var i = start;
    while (i < end) {
      var b = buf[i];
      var c = 0xfffd;
      var n = 1;
      if (b < 0x80) {
        c = b;
      } else if (b >= 0xc2 && b <= 0xdf && i + 1 < end && (buf[i + 1] & 0xc0) === 0x80) {
        c = ((b & 31) << 6) | (buf[i + 1] & 63);
        n = 2;
      } else if (b >= 0xe0 && b <= 0xef && i + 2 < end &&
        (buf[i + 1] & 0xc0) === 0x80 && (buf[i + 2] & 0xc0) === 0x80) {
        c = ((b & 15) << 12) | ((buf[i + 1] & 63) << 6) | (buf[i + 2] & 63);
        n = 3;
        if (c < 0x800 || (c >= 0xd800 && c <= 0xdfff)) { c = 0xfffd; n = 1; }
      } else if (b >= 0xf0 && b <= 0xf4 && i + 3 < end && (buf[i + 1] & 0xc0) === 0x80 &&
        (buf[i + 2] & 0xc0) === 0x80 && (buf[i + 3] & 0xc0) === 0x80) {
        c = ((b & 7) << 18) | ((buf[i + 1] & 63) << 12) | ((buf[i + 2] & 63) << 6) | (buf[i + 3] & 63);
        n = 4;
        if (c < 0x10000 || c > 0x10ffff) { c = 0xfffd; n = 1; }
      }
      if (c >= 0x10000) {
        c -= 0x10000;
        out += String.fromCharCode(0xd800 + (c >> 10), 0xdc00 + (c & 1023));
      } else {
        out += String.fromCharCode(c);
      }
      i += n;
    }
    return out;
  }

  function hexText(buf, start, end) {
    var out = '';
    for (var i = start; i < end; i++) out += HEX.charAt(buf[i] >> 4) + HEX.charAt(buf[i] & 15);
    return out;
  }

  function base64Text(buf, start, end, url) {
    var alphabet = url ? B64.slice(0, 62) + '-_' : B64;
    var out = '';
    var i = start;
    for (; i + 2 < end; i += 3) {
      var n = (buf[i] << 16) | (buf[i + 1] << 8) | buf[i + 2];
      out += alphabet.charAt(n >> 18) + alphabet.charAt((n >> 12) & 63) +
        alphabet.charAt((n >> 6) & 63) + alphabet.charAt(n & 63);
    }
    if (end - i === 1) {
      var one = buf[i] << 16;
      out += alphabet.charAt(one >> 18) + alphabet.charAt((one >> 12) & 63) + (url ? '' : '==');
    } else if (end - i === 2) {
      var two = (buf[i] << 16) | (buf[i + 1] << 8);
      out += alphabet.charAt(two >> 18) + alphabet.charAt((two >> 12) & 63) +
        alphabet.charAt((two >> 6) & 63) + (url ? '' : '=');
    }
    return out;
  }

  // ---- constructors ----

  function fromBytes(bytes) {
    var buf = make(bytes.length);
    for (var i = 0; i < bytes.length; i++) buf[i] = bytes[i];
    return buf;
  }

  function from(value, encodingOrOffset, length) {
    if (typeof value === 'string') return fromBytes(stringBytes(value, encodingOrOffset));
    if (value instanceof ArrayBuffer) {
      var offset = encodingOrOffset === undefined ? 0 : Number(encodingOrOffset);
      var len = length === undefined ? value.byteLength - offset : Number(length);
      if (offset < 0 || offset > value.byteLength) throw rangeError('offset', 0, value.byteLength, offset);
      if (len < 0 || offset + len > value.byteLength) throw rangeError('length', 0, value.byteLength - offset, len);
      return new FastBuffer(value, offset, len);
    }
    if (value !== null && typeof value === 'object') {
      if (ArrayBuffer.isView(value)) {
        var copy = make(value.length);
        for (var i = 0; i < value.length; i++) copy[i] = value[i];
        return copy;
      }
      if (value.type === 'Buffer' && Array.isArray(value.data)) return fromBytes(value.data);
      if (typeof value.length === 'number') {
        var n = checkLength(value.length);
        var buf = make(n);
        for (var j = 0; j < n; j++) buf[j] = value[j];
        return buf;
      }
    }
    throw typeError('The first argument must be of type string or an instance of Buffer, ' +
      'ArrayBuffer, or Array or an Array-like Object. Received ' +
      (value === null ? 'null' : typeof value));
  }

  function fill(buf, value, encoding) {
    if (value === undefined || buf.length === 0) return buf;
    if (typeof value === 'number') {
      for (var i = 0; i < buf.length; i++) buf[i] = value;
      return buf;
    }
    var bytes = typeof value === 'string' ? stringBytes(value, encoding) : value;
    if (bytes.length === 0) {
      throw rangeError('value', 'a non-empty value', undefined, String(value));
    }
    for (var j = 0; j < buf.length; j++) buf[j] = bytes[j % bytes.length];
    return buf;
  }

  function alloc(size, value, encoding) {
    return fill(make(checkLength(size)), value, encoding);
  }

  Buffer.from = from;
  Buffer.alloc = alloc;
  Buffer.allocUnsafe = function (size) { return make(checkLength(size)); };
  Buffer.allocUnsafeSlow = Buffer.allocUnsafe;
  Buffer.isBuffer = function (value) { return value instanceof FastBuffer; };
  Buffer.isEncoding = function (encoding) {
    try { normalizeEncoding(encoding); return typeof encoding === 'string'; } catch (e) { return false; }
  };
  Buffer.byteLength = function (value, encoding) {
    if (typeof value === 'string') return stringBytes(value, encoding).length;
    return value.byteLength;
  };
  Buffer.concat = function (list, totalLength) {
    if (!Array.isArray(list)) throw typeError('The "list" argument must be an instance of Array');
    var total = 0;
    for (var i = 0; i < list.length; i++) {
      if (!(list[i] instanceof U8)) {
        throw typeError('The "list[' + i + ']" argument must be an instance of Buffer or Uint8Array');
      }
      total += list[i].length;
    }
    if (totalLength !== undefined) total = checkLength(totalLength);
    var out = make(total);
    var at = 0;
    for (var k = 0; k < list.length && at < total; k++) {
      var part = list[k];
      for (var j = 0; j < part.length && at < total; j++) out[at++] = part[j];
    }
    return out;
  };
  Buffer.compare = function (a, b) { return compare(a, b); };
  Buffer.poolSize = 8192;

  function compare(a, b) {
    var n = Math.min(a.length, b.length);
    for (var i = 0; i < n; i++) {
      if (a[i] !== b[i]) return a[i] < b[i] ? -1 : 1;
    }
    return a.length === b.length ? 0 : (a.length < b.length ? -1 : 1);
  }

  // ---- instance methods ----

  var proto = Buffer.prototype;
  function method(name, fn) {
    Object.defineProperty(proto, name, { value: fn, writable: true, configurable: true, enumerable: false });
  }

  function bounds(buf, start, end) {
    var len = buf.length;
    start = start === undefined ? 0 : Math.trunc(Number(start)) || 0;
    end = end === undefined ? len : Math.trunc(Number(end)) || 0;
    if (start < 0) start = Math.max(len + start, 0);
    if (end < 0) end = Math.max(len + end, 0);
    if (start > len) start = len;
    if (end > len) end = len;
    return [start, end];
  }

  // Node's slice and subarray both share memory with the original.
  function view(start, end) {
    var b = bounds(this, start, end);
    var n = Math.max(b[1] - b[0], 0);
    return new FastBuffer(this.buffer, this.byteOffset + b[0], n);
  }
  method('subarray', view);
  method('slice', view);

  method('toString', function (encoding, start, end) {
    var b = bounds(this, start, end);
    if (b[1] <= b[0]) return '';
    switch (normalizeEncoding(encoding)) {
      case 'hex': return hexText(this, b[0], b[1]);
      case 'base64': return base64Text(this, b[0], b[1], false);
      case 'base64url': return base64Text(this, b[0], b[1], true);
      case 'ascii': {
        var ascii = '';
        for (var i = b[0]; i < b[1]; i++) ascii += String.fromCharCode(this[i] & 0x7f);
        return ascii;
      }
      case 'latin1': {
        var latin = '';
        for (var j = b[0]; j < b[1]; j++) latin += String.fromCharCode(this[j]);
        return latin;
      }
      case 'utf16le': {
        var wide = '';
        for (var k = b[0]; k + 1 < b[1]; k += 2) wide += String.fromCharCode(this[k] | (this[k + 1] << 8));
        return wide;
      }
      default: return utf8Text(this, b[0], b[1]);
    }
  });
  method('toLocaleString', proto.toString);
  method('toJSON', function () {
    var data = [];
    for (var i = 0; i < this.length; i++) data.push(this[i]);
    return { type: 'Buffer', data: data };
  });
  method('equals', function (other) {
    if (!(other instanceof U8)) throw typeError('The "otherBuffer" argument must be an instance of Buffer or Uint8Array');
    return compare(this, other) === 0;
  });
  method('compare', function (other) { return compare(this, other); });
  method('copy', function (target, targetStart, sourceStart, sourceEnd) {
    targetStart = targetStart === undefined ? 0 : targetStart;
    var b = bounds(this, sourceStart, sourceEnd);
    var n = 0;
    for (var i = b[0]; i < b[1] && targetStart + n < target.length; i++) target[targetStart + n++] = this[i];
    return n;
  });
  method('write', function (string, offset, length, encoding) {
    if (typeof offset === 'string') { encoding = offset; offset = 0; length = undefined; }
    else if (typeof length === 'string') { encoding = length; length = undefined; }
    offset = offset === undefined ? 0 : offset;
    var bytes = stringBytes(string, encoding);
    var room = this.length - offset;
    var n = Math.min(bytes.length, room, length === undefined ? room : length);
    for (var i = 0; i < n; i++) this[offset + i] = bytes[i];
    return Math.max(n, 0);
  });
  method('fill', function (value, offset, end, encoding) {
    if (typeof offset === 'string') { encoding = offset; offset = undefined; end = undefined; }
    var b = bounds(this, offset, end);
    fill(new FastBuffer(this.buffer, this.byteOffset + b[0], Math.max(b[1] - b[0], 0)), value, encoding);
    return this;
  });

  // Integers, byte by byte: `size` bytes from `offset`, unsigned.
  function readBE(buf, offset, size) {
    var v = 0;
    for (var i = 0; i < size; i++) v = v * 256 + buf[offset + i];
    return v;
  }
  function readLE(buf, offset, size) {
    var v = 0;
    for (var i = size - 1; i >= 0; i--) v = v * 256 + buf[offset + i];
    return v;
  }
  function signed(v, size) {
    var top = Math.pow(2, 8 * size - 1);
    return v >= top ? v - 2 * top : v;
  }
  function writeBE(buf, value, offset, size) {
    var v = value < 0 ? value + Math.pow(2, 8 * size) : value;
    for (var i = size - 1; i >= 0; i--) { buf[offset + i] = v % 256; v = Math.floor(v / 256); }
    return offset + size;
  }
  function writeLE(buf, value, offset, size) {
    var v = value < 0 ? value + Math.pow(2, 8 * size) : value;
    for (var i = 0; i < size; i++) { buf[offset + i] = v % 256; v = Math.floor(v / 256); }
    return offset + size;
  }

  function integers(size, name) {
    var max = Math.pow(2, 8 * size);
    var readU = function (le) {
      return function (offset) {
        offset = checkOffset(this, offset, size);
        return le ? readLE(this, offset, size) : readBE(this, offset, size);
      };
    };
    var readS = function (le) {
      return function (offset) {
        offset = checkOffset(this, offset, size);
        return signed(le ? readLE(this, offset, size) : readBE(this, offset, size), size);
      };
    };
    var writeU = function (le) {
      return function (value, offset) {
        value = Math.trunc(checkValue(value, 0, max - 1));
        offset = checkOffset(this, offset, size);
        return le ? writeLE(this, value, offset, size) : writeBE(this, value, offset, size);
      };
    };
    var writeS = function (le) {
      return function (value, offset) {
        value = Math.trunc(checkValue(value, -max / 2, max / 2 - 1));
        offset = checkOffset(this, offset, size);
        return le ? writeLE(this, value, offset, size) : writeBE(this, value, offset, size);
      };
    };
    var suffixes = size === 1 ? [['', true]] : [['LE', true], ['BE', false]];
    suffixes.forEach(function (s) {
      var u = readU(s[1]);
      var w = writeU(s[1]);
      method('readUInt' + name + s[0], u);
      method('readUint' + name + s[0], u);
      method('readInt' + name + s[0], readS(s[1]));
      method('writeUInt' + name + s[0], w);
      method('writeUint' + name + s[0], w);
      method('writeInt' + name + s[0], writeS(s[1]));
    });
  }
  integers(1, '8');
  integers(2, '16');
  integers(4, '32');

  // Variable-width integers, 1 to 6 bytes: readUIntLE(offset, byteLength).
  function checkWidth(byteLength) {
    if (byteLength !== Math.floor(byteLength) || byteLength < 1 || byteLength > 6) {
      throw rangeError('byteLength', 1, 6, byteLength);
    }
    return byteLength;
  }
  [['LE', true], ['BE', false]].forEach(function (s) {
    var le = s[1];
    var readU = function (offset, byteLength) {
      var size = checkWidth(byteLength);
      offset = checkOffset(this, offset, size);
      return le ? readLE(this, offset, size) : readBE(this, offset, size);
    };
    method('readUInt' + s[0], readU);
    method('readUint' + s[0], readU);
    method('readInt' + s[0], function (offset, byteLength) {
      var size = checkWidth(byteLength);
      offset = checkOffset(this, offset, size);
      return signed(le ? readLE(this, offset, size) : readBE(this, offset, size), size);
    });
    var writeU = function (value, offset, byteLength) {
      var size = checkWidth(byteLength);
      value = Math.trunc(checkValue(value, 0, Math.pow(2, 8 * size) - 1));
      offset = checkOffset(this, offset, size);
      return le ? writeLE(this, value, offset, size) : writeBE(this, value, offset, size);
    };
    method('writeUInt' + s[0], writeU);
    method('writeUint' + s[0], writeU);
    method('writeInt' + s[0], function (value, offset, byteLength) {
      var size = checkWidth(byteLength);
      var half = Math.pow(2, 8 * size - 1);
      value = Math.trunc(checkValue(value, -half, half - 1));
      offset = checkOffset(this, offset, size);
      return le ? writeLE(this, value, offset, size) : writeBE(this, value, offset, size);
    });
  });

  // Floats go through the scratch area in the host's byte order.
  function floats(size, name, array) {
    [['LE', true], ['BE', false]].forEach(function (s) {
      var swap = s[1] !== littleEndianHost;
      method('read' + name + s[0], function (offset) {
        offset = checkOffset(this, offset, size);
        for (var i = 0; i < size; i++) scratchBytes[swap ? size - 1 - i : i] = this[offset + i];
        return array[0];
      });
      method('write' + name + s[0], function (value, offset) {
        offset = checkOffset(this, offset, size);
        array[0] = +value;
        for (var i = 0; i < size; i++) this[offset + i] = scratchBytes[swap ? size - 1 - i : i];
        return offset + size;
      });
    });
  }
  floats(4, 'Float', scratchF32);
  floats(8, 'Double', scratchF64);

  // 64-bit integers as BigInt.
  [['LE', true], ['BE', false]].forEach(function (s) {
    var le = s[1];
    var read = function (buf, offset) {
      offset = checkOffset(buf, offset, 8);
      var lo = le ? readLE(buf, offset, 4) : readBE(buf, offset + 4, 4);
      var hi = le ? readLE(buf, offset + 4, 4) : readBE(buf, offset, 4);
      return (BigInt(hi) << 32n) + BigInt(lo);
    };
    var u = function (offset) { return read(this, offset); };
    method('readBigUInt64' + s[0], u);
    method('readBigUint64' + s[0], u);
    method('readBigInt64' + s[0], function (offset) { return BigInt.asIntN(64, read(this, offset)); });
    var write = function (buf, value, offset) {
      offset = checkOffset(buf, offset, 8);
      var v = BigInt.asUintN(64, value);
      var lo = Number(v & 0xffffffffn);
      var hi = Number(v >> 32n);
      if (le) { writeLE(buf, lo, offset, 4); writeLE(buf, hi, offset + 4, 4); }
      else { writeBE(buf, hi, offset, 4); writeBE(buf, lo, offset + 4, 4); }
      return offset + 8;
    };
    var wu = function (value, offset) {
      if (value < 0n || value > 0xffffffffffffffffn) throw rangeError('value', '0n', '2n ** 64n - 1n', value);
      return write(this, value, offset);
    };
    method('writeBigUInt64' + s[0], wu);
    method('writeBigUint64' + s[0], wu);
    method('writeBigInt64' + s[0], function (value, offset) {
      if (value < -0x8000000000000000n || value > 0x7fffffffffffffffn) {
        throw rangeError('value', '-(2n ** 63n)', '2n ** 63n - 1n', value);
      }
      return write(this, value, offset);
    });
  });

  return Buffer;
})
