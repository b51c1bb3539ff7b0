// The chart library's files, imported as text and served from the binary.
declare module "uplot/dist/uPlot.iife.min.js" {
  const text: string;
  export default text;
}
declare module "uplot/dist/uPlot.min.css" {
  const text: string;
  export default text;
}
